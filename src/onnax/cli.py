"""The ``onnax`` command line.

``onnax grad|jvp|vjp|vmap|jacfwd|jacrev|hessian IN.onnx OUT.onnx`` writes a transformed model,
``onnax family IN.onnx DIR/f.onnx`` writes a CasADi family, ``onnax info IN.onnx`` describes a
model and the rules onnax has for its operators, and ``onnax demo`` runs the built-in example.
``--check`` runs the result in onnxruntime on random inputs against finite differences of the
source model. Errors print one paragraph and exit with status 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnax.errors import OnnaxError

__all__ = ["build_parser", "main"]

TRANSFORMS = ("grad", "jvp", "vjp", "vmap", "jacfwd", "jacrev", "hessian")

Feeds = dict[str, np.ndarray]


class CliError(OnnaxError):
    """A bad command-line argument (an unreadable file, a malformed axis list)."""


# ------------------------------------------------------------------------------- progress
class Progress:
    """One line of progress on stderr, rewritten in place when stderr is a terminal."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._open = False

    def __call__(self, message: str) -> None:
        """Shows ``message`` with the elapsed time."""
        if self.quiet:
            return
        line = f"onnax [{time.perf_counter() - self.start:6.1f}s] {message}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
            self._open = True
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        """Ends a line left open on a terminal."""
        if self._open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._open = False


# -------------------------------------------------------------------------------- arguments
def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def _axis(text: str) -> int | None:
    text = text.strip()
    if text.lower() in ("none", "null", "-", ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise CliError(f"an axis must be an integer or None, got {text!r}") from None


def parse_axes(text: str | None) -> Any:
    """``--in-axes``/``--out-axes``: ``0``, ``0,None`` (by position) or ``x=0,w=None`` (by name)."""
    if text is None:
        return 0
    parts = [p for p in text.split(",") if p.strip()]
    if any("=" in p for p in parts):
        if not all("=" in p for p in parts):
            raise CliError(f"mix of named and positional axes in {text!r}; use one form")
        return {k.strip(): _axis(v) for k, v in (p.split("=", 1) for p in parts)}
    if len(parts) == 1:
        return _axis(parts[0])
    return tuple(_axis(p) for p in parts)


def parse_dims(items: Sequence[str] | None) -> dict[str, int | None] | None:
    """``--dim N=4`` (bind) or ``--dim N=symbolic`` (keep); repeatable."""
    if not items:
        return None
    dims: dict[str, int | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"--dim takes NAME=SIZE or NAME=symbolic, got {item!r}")
        if value.strip().lower() in ("symbolic", "none", "keep"):
            dims[name.strip()] = None
        else:
            try:
                dims[name.strip()] = int(value)
            except ValueError:
                raise CliError(
                    f"--dim {item!r}: the size must be an integer or 'symbolic'"
                ) from None
    return dims


def _load(path: str) -> ir.Model:
    if not Path(path).is_file():
        raise CliError(f"no such file: {path}")
    try:
        return ir.load(path)
    except Exception as err:
        duplicate = _duplicate_value(path)
        if duplicate is not None:
            name, graph = duplicate
            raise CliError(
                f"cannot read {path}: the value name {name!r} is defined twice in graph "
                f"{graph!r} (ONNX is single assignment: every node output, graph input and "
                "initializer needs its own name). Rename one of the two definitions."
            ) from err
        raise CliError(f"cannot read {path} as an ONNX model: {err}") from err


def _duplicate_value(path: str) -> tuple[str, str] | None:
    """The first value name defined twice in a graph of the file, and that graph's name.

    onnx_ir refuses such a model with a message that names neither; the protobuf, read without
    its weights, says which.
    """
    import onnx

    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception:
        return None
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        seen: set[str] = set()
        defined = [
            *(v.name for v in graph.input),
            *(t.name for t in graph.initializer if t.name not in {v.name for v in graph.input}),
            *(out for node in graph.node for out in node.output if out),
        ]
        for name in defined:
            if name in seen:
                return name, graph.name
            seen.add(name)
        for node in graph.node:
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else [])
                graphs.extend(attr.graphs)
    return None


def _refuse_overwrite(source: str, results: Sequence[Path]) -> None:
    """Refuses a result path that is the source file: the source would be lost."""
    src = Path(source).resolve()
    for result in results:
        if result.resolve() == src:
            raise CliError(
                f"the result {str(result)!r} is the input model {source!r}: writing it would "
                "overwrite the source. Give the result another file name."
            )


def _has_external_data(model: ir.Model) -> bool:
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


def _save(model: ir.Model, source: ir.Model, path: str) -> None:
    """Writes ``model``; with external data beside it when the source kept its weights there.

    The result shares the source's weight tensors, whose external references are relative to
    the source's folder: saved as they are, they would point nowhere from another folder, and
    saved inline they could exceed protobuf's 2 GB.
    """
    if _has_external_data(source):
        ir.save(model, path, external_data=Path(path).name + ".data")
    else:
        ir.save(model, path)


# --------------------------------------------------------------------------------- transforms
def _apply(args: argparse.Namespace, model: ir.Model) -> ir.Model:
    from onnax import api

    if args.command == "vmap":
        return api.vmap(
            model,
            parse_axes(args.in_axes),
            parse_axes(args.out_axes),
            args.axis_size,
            args.randomness,
        )
    inputs = _names(args.inputs)
    stop = _names(args.stop_gradient)
    if args.command == "grad":
        return api.grad(model, inputs, args.output, args.accumulate, stop_gradient=stop)
    if args.command in ("jvp", "vjp"):
        transform_acc: Callable[..., ir.Model] = getattr(api, args.command)
        return transform_acc(
            model, inputs, _names(args.outputs), args.accumulate, stop_gradient=stop
        )
    if args.command == "hessian":
        return api.hessian(model, inputs, args.output, stop_gradient=stop)
    transform: Callable[..., ir.Model] = getattr(api, args.command)
    return transform(model, inputs, _names(args.outputs), stop_gradient=stop)


def _transform(args: argparse.Namespace, progress: Progress) -> int:
    if args.check and getattr(args, "stop_gradient", None):
        raise CliError(
            "--check and --stop-gradient together: the check's reference, "
            "finite differences of the source model, differentiates through the stopped values, "
            "so it would report a mismatch for a correct result. Drop --check."
        )
    _refuse_overwrite(args.model, [Path(args.result)])
    progress(f"reading {args.model}")
    model = _load(args.model)
    progress(f"{args.command}: transforming {len(model.graph)} nodes")
    out = _apply(args, model)
    progress(f"writing {args.result}")
    _save(out, model, args.result)
    progress.done()
    before_in = {v.name for v in model.graph.inputs}
    before_out = {v.name for v in model.graph.outputs}
    added_in = [v.name for v in out.graph.inputs if v.name not in before_in]
    added_out = [v.name for v in out.graph.outputs if v.name not in before_out]
    print(
        f"wrote {args.result}: {len(out.graph)} nodes, added inputs {added_in}, "
        f"added outputs {added_out}"
    )
    if args.check:
        rows = check_transform(args, model, out, progress)
        progress.done()
        print(format_check(rows))
        if any(not ok for *_, ok in rows):
            raise CliError(
                "--check: the result disagrees with its reference (rows marked FAIL above: finite "
                "differences of the source model, or the source run example by example for vmap). "
                "Please report it with the model."
            )
    return 0


# ------------------------------------------------------------------------------------ --check
def _session(model: ir.Model) -> Callable[[Feeds], dict[str, np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if _has_external_data(model):
        # From bytes, onnxruntime resolves external references against the working directory:
        # the session reads a copy saved with its own data file instead.
        with tempfile.TemporaryDirectory() as folder:
            path = str(Path(folder) / "model.onnx")
            ir.save(model, path, external_data="model.onnx.data")
            sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    else:
        sess = ort.InferenceSession(
            ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    names = [o.name for o in sess.get_outputs()]
    wanted = [i.name for i in sess.get_inputs()]

    def run(feeds: Feeds) -> dict[str, np.ndarray]:
        return dict(zip(names, sess.run(None, {k: feeds[k] for k in wanted}), strict=True))

    return run


def _random_feeds(model: ir.Model, rng: np.random.Generator, size: int = 2) -> Feeds:
    feeds: Feeds = {}
    for v in model.graph.inputs:
        if v.name in model.graph.initializers or v.dtype is None:
            continue
        shape = [d if isinstance(d, int) else size for d in (v.shape.dims if v.shape else [])]
        dtype = v.dtype.numpy()
        if v.dtype.is_floating_point():
            feeds[str(v.name)] = rng.uniform(-1.0, 1.0, shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[str(v.name)] = np.zeros(shape, dtype)
        else:
            feeds[str(v.name)] = np.zeros(shape, dtype)
    return feeds


def _widen_array(a: np.ndarray) -> np.ndarray:
    """FLOAT16/BFLOAT16 data as float32 (exact), the feeds of a half model's FLOAT version."""
    return a.astype(np.float32) if a.dtype == np.float16 or a.dtype.name == "bfloat16" else a


def _eps(dtype: np.dtype) -> tuple[float, float]:
    """Finite-difference step and relative tolerance for an element type."""
    return (1e-6, 1e-5) if dtype == np.float64 else (3e-3, 2e-2)


Row = tuple[str, str, float, float, bool]


def check_transform(
    args: argparse.Namespace, source: ir.Model, result: ir.Model, progress: Progress
) -> list[Row]:
    """Checks ``result`` against central finite differences of ``source``.

    Returns rows ``(what, output, scale, error, ok)``.
    """
    from onnax.core.widen import holds_half, widen_half
    from onnax.passes.prepare import prepare

    rng = np.random.default_rng(0)
    source = prepare(source, args.command)  # typed outputs, to know which axes were added
    progress("--check: building sessions")
    # A half model's differences are taken on its FLOAT version (a FLOAT16 step drowns in
    # rounding), fed the same values widened exactly.
    f = _session(widen_half(source) if holds_half(source) else source)
    g = _session(result)
    feeds = _random_feeds(source, rng)
    floats = {k for k, v in feeds.items() if v.dtype.kind == "f"}
    n_in = len(source.graph.inputs)
    n_out = len(source.graph.outputs)
    rows: list[Row] = []

    def fd(direction: Feeds, eps: float) -> dict[str, np.ndarray]:
        wide = {k: _widen_array(v) for k, v in feeds.items()}
        step = {k: eps * _widen_array(d) for k, d in direction.items()}
        plus = {k: v + step[k] if k in step else v for k, v in wide.items()}
        minus = {k: v - step[k] if k in step else v for k, v in wide.items()}
        a, b = f(plus), f(minus)
        return {k: (a[k].astype(np.float64) - b[k].astype(np.float64)) / (2 * eps) for k in a}

    def row(
        what: str, out: str, got: np.ndarray | float, want: np.ndarray | float, dt: Any
    ) -> None:
        _, tol = _eps(np.dtype(dt))
        scale = float(np.max(np.abs(want))) if np.size(want) else 0.0
        err = float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))))
        rows.append((what, out, scale, err, err <= tol * max(1.0, scale)))

    command = args.command
    added_in = list(result.graph.inputs)[n_in:]
    added_out = list(result.graph.outputs)[n_out:]
    if command == "vmap":
        progress("--check: running examples one by one")
        return _check_vmap(args, source, result, rng)
    if command == "jvp":
        tangents: Feeds = {}
        for t in added_in:
            base = str(t.name).split("_", 1)[1]
            tangents[base] = rng.standard_normal(feeds[base].shape).astype(feeds[base].dtype)
        tangent_feeds = {str(t.name): tangents[str(t.name).split("_", 1)[1]] for t in added_in}
        pushed = g({**feeds, **tangent_feeds})
        step = _eps(next(iter(tangents.values())).dtype)[0] if tangents else 1e-6
        moved = fd(tangents, step)
        for o in added_out:
            base = str(o.name).split("_", 1)[1]
            row("jvp", str(o.name), pushed[str(o.name)], moved[base], feeds_dtype(o))
        return rows
    if command in ("vjp", "grad"):
        seeds: Feeds = {}
        for t in added_in:
            base = str(t.name).split("_", 1)[1]
            shape = [d if isinstance(d, int) else 2 for d in t.shape.dims] if t.shape else []
            seeds[base] = rng.standard_normal(shape).astype(feeds_dtype(t))
        seed_feeds = {str(t.name): seeds[str(t.name).split("_", 1)[1]] for t in added_in}
        pulled = g({**feeds, **seed_feeds})
        for o in added_out:
            base = str(o.name).split("_", 1)[1]
            if base not in feeds:
                continue  # an initializer: its direction would need the stored value
            direction = {base: rng.standard_normal(feeds[base].shape).astype(feeds[base].dtype)}
            along = fd(direction, _eps(feeds[base].dtype)[0])
            if command == "grad":
                loss = args.output or next(
                    str(y.name)
                    for y in source.graph.outputs
                    if y.shape is not None and y.shape.rank() == 0
                )
                expected = float(np.sum(along[loss]))
            else:
                expected = sum(float(np.sum(seeds[y] * along[y])) for y in seeds)
            got_dot = float(np.sum(pulled[str(o.name)].astype(np.float64) * direction[base]))
            row(command, str(o.name), got_dot, expected, feeds[base].dtype)
        return rows
    # jacfwd / jacrev / hessian: contract the derivative tensor with random directions.
    progress("--check: contracting derivative tensors")
    tensors = g(feeds)
    for o in added_out:
        name = str(o.name)
        if command == "hessian":
            y, x1, x2 = _split_hess(name, source, floats)
            if x1 is None or x2 is None:
                continue
            v1 = rng.standard_normal(feeds[x1].shape)
            v2 = rng.standard_normal(feeds[x2].shape)
            h = tensors[name].astype(np.float64)
            second = float(np.tensordot(np.tensordot(h, v2, axes=v2.ndim), v1, axes=v1.ndim))
            step2 = 1e-3 if feeds[x1].dtype == np.float64 else 3e-2
            reference = _second_difference(f, feeds, y, x1, v1, x2, v2, step2)
            _, tol = _eps(feeds[x1].dtype)
            size = abs(reference)
            error = abs(second - reference)
            rows.append(("hessian", name, size, error, error <= 100 * tol * max(1.0, size)))
        else:
            y, x = _split_jac(name, source, floats)
            if x is None:
                continue
            v = rng.standard_normal(feeds[x].shape)
            jac = tensors[name].astype(np.float64)
            contracted = np.tensordot(jac, v, axes=v.ndim)
            reference_jv = fd({x: v.astype(feeds[x].dtype)}, _eps(feeds[x].dtype)[0])[y]
            row(command, name, contracted, reference_jv, feeds[x].dtype)
    return rows


def feeds_dtype(value: ir.Value) -> Any:
    """The numpy element type of a graph value (float64 when unknown)."""
    return value.dtype.numpy() if value.dtype is not None else np.float64


def _split_jac(name: str, source: ir.Model, floats: set[str]) -> tuple[str, str | None]:
    body = name.split("_", 1)[1]
    for y in source.graph.outputs:
        prefix = f"{y.name}_"
        if body.startswith(prefix) and body[len(prefix) :] in floats:
            return str(y.name), body[len(prefix) :]
    return body, None


def _split_hess(
    name: str, source: ir.Model, floats: set[str]
) -> tuple[str, str | None, str | None]:
    body = name.split("_", 1)[1]
    for y in source.graph.outputs:
        prefix = f"{y.name}_"
        if not body.startswith(prefix):
            continue
        rest = body[len(prefix) :]
        for x1 in floats:
            if rest.startswith(f"{x1}_") and rest[len(x1) + 1 :] in floats:
                return str(y.name), x1, rest[len(x1) + 1 :]
    return body, None, None


def _second_difference(
    f: Callable[[Feeds], dict[str, np.ndarray]],
    feeds: Feeds,
    y: str,
    x1: str,
    v1: np.ndarray,
    x2: str,
    v2: np.ndarray,
    eps: float,
) -> float:
    def at(s1: float, s2: float) -> float:
        moved = dict(feeds)
        moved[x1] = (moved[x1] + s1 * eps * v1).astype(feeds[x1].dtype)
        moved[x2] = (moved[x2] + s2 * eps * v2).astype(feeds[x2].dtype)
        return float(np.sum(f(moved)[y].astype(np.float64)))

    return (at(1, 1) - at(1, -1) - at(-1, 1) + at(-1, -1)) / (4 * eps * eps)


def _per_value_axes(spec: Any, values: Sequence[ir.Value]) -> list[int | None]:
    """An ``--in-axes``/``--out-axes`` value resolved to one normalised axis per value."""
    names = [str(v.name) for v in values]
    if spec is None or isinstance(spec, int):
        axes: list[int | None] = [spec] * len(values)
    elif isinstance(spec, dict):
        axes = [spec.get(n) for n in names]
    else:
        axes = list(spec)
    out: list[int | None] = []
    for axis, v in zip(axes, values, strict=True):
        rank = v.shape.rank() if v.shape is not None else 0
        out.append(None if axis is None else axis % (rank + 1))
    return out


def _check_vmap(
    args: argparse.Namespace, source: ir.Model, result: ir.Model, rng: np.random.Generator
) -> list[Row]:
    """Checks vmap against a loop over examples (no derivative: the reference is the source model)."""
    f = _session(source)
    g = _session(result)
    size = args.axis_size or 3
    graph = source.graph
    inputs = list(graph.inputs)
    in_axes = _per_value_axes(parse_axes(args.in_axes), inputs)
    out_axes = _per_value_axes(parse_axes(args.out_axes), list(graph.outputs))
    per_example = [_random_feeds(source, rng) for _ in range(size)]
    feeds: Feeds = {}
    for v, axis in zip(inputs, in_axes, strict=True):
        name = str(v.name)
        if name not in per_example[0]:
            continue
        if axis is None or name in graph.initializers:
            for ex in per_example:
                ex[name] = per_example[0][name]
            feeds[name] = per_example[0][name]
        else:
            feeds[name] = np.stack([ex[name] for ex in per_example], axis=axis)
    got = g(feeds)
    rows: list[Row] = []
    for y, axis in zip(graph.outputs, out_axes, strict=True):
        wants = [f(ex)[str(y.name)] for ex in per_example]
        want = np.stack(wants, axis=axis) if axis is not None else wants[0]
        have = got[str(y.name)].astype(np.float64)
        err = (
            float(np.max(np.abs(have - want))) if want.size and have.shape == want.shape else np.inf
        )
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        tol = 1e-9 if want.dtype == np.float64 else 1e-4
        rows.append(("vmap", str(y.name), scale, err, err <= tol * max(1.0, scale)))
    return rows


def format_check(rows: Sequence[Row]) -> str:
    """The --check table."""
    head = f"{'check':<8} {'output':<28} {'max |ref|':>10} {'max |err|':>10}  result"
    lines = [head, "-" * len(head)]
    for what, out, scale, err, ok in rows:
        lines.append(f"{what:<8} {out:<28} {scale:>10.3g} {err:>10.2e}  {'ok' if ok else 'FAIL'}")
    if not rows:
        lines.append("(nothing to compare: no floating-point derivative outputs)")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- family
def _family(args: argparse.Namespace, progress: Progress) -> int:
    from onnax.casadi import CasadiContractError, check_family, family

    target = Path(args.result)
    # The family rewrites f.onnx and every <kind>_f.onnx beside it (stale ones are removed).
    sibling = Path(args.model).name.endswith(f"_{target.name}")
    _refuse_overwrite(
        args.model, [target, target.parent / Path(args.model).name] if sibling else [target]
    )
    progress(f"reading {args.model}")
    model = _load(args.model)
    kinds = _names(args.kinds) or ["adj", "fwd_adj"]
    progress(f"family: building {', '.join(kinds)} for {len(model.graph)} nodes")
    try:
        fam = family(
            model,
            args.result,
            inputs=_names(args.inputs),
            outputs=_names(args.outputs),
            layout=args.layout,
            kinds=kinds,
            dims=parse_dims(args.dim),
        )
    except CasadiContractError as err:
        if "symbolic dimensions" in str(err):
            raise CasadiContractError(
                f"{err} On the command line: --dim NAME=4 binds, --dim NAME=symbolic keeps."
            ) from err
        raise
    progress.done()
    print(f"wrote the family of {fam.path} ({fam.layout} layout):")
    for kind, path in fam.files.items():
        m = ir.load(path)
        print(f"  {path.name:<24} {kind:<8} {len(m.graph):>6} nodes")
    print(f"differentiable inputs {list(fam.inputs)}, parameters {list(fam.parameters)}")
    if fam.values:
        print(f"initializers now inputs (feed their stored values): {sorted(fam.values)}")
    symbolic = [k for k, v in fam.dims.items() if v is None]
    if symbolic:
        print(f"symbolic dimensions {symbolic}: bind them with GraphBuilder(path).bind_dim(...)")
    if args.check:
        progress("--check: checking the files against the CasADi contract")
        check_family(fam.path, list(fam.inputs), fam.layout)
        progress.done()
        print("contract check: ok")
    return 0


# ----------------------------------------------------------------------------------------- info
def _info(args: argparse.Namespace, progress: Progress) -> int:
    from onnax.core.registry import batch_rules, jvp_rules, transpose_rules
    from onnax.core.selection import format_shape
    from onnax.rules import collect

    model = _load(args.model)
    collect()
    try:
        # Inferred types and shapes for the listing; the file is described as it is otherwise.
        from onnax.passes.prepare import infer_shapes

        typed = model.clone()
        infer_shapes(typed)
        model = typed
    except Exception:
        pass
    graph = model.graph
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    print(f"{args.model}: ir_version {model.ir_version}, opsets {dict(model.opset_imports)}")

    def describe(v: ir.Value) -> str:
        dtype = v.dtype.name if v.dtype is not None else "?"
        return f"  {v.name:<24} {dtype:<8} {format_shape(v.shape)}"

    inputs = [v for v in graph.inputs if v.name not in graph.initializers]
    print(f"inputs ({len(inputs)}):")
    for v in inputs:
        print(describe(v))
    print(f"outputs ({len(graph.outputs)}):")
    for v in graph.outputs:
        print(describe(v))
    print(f"initializers: {len(graph.initializers)}")
    counts: Counter[tuple[str, str]] = Counter()
    for g in model.graphs():
        for node in g:
            counts[(node.domain, node.op_type)] += 1
    print(f"operators ({sum(counts.values())} nodes, {len(counts)} kinds):")
    head = f"  {'operator':<32} {'count':>5}  {'jvp':<4} {'vjp':<4} {'transpose':<9} {'vmap':<4}"
    print(head)
    missing: dict[str, list[str]] = {"jvp": [], "vjp": [], "vmap": []}
    for (domain, op), n in sorted(counts.items()):
        label = f"{domain}::{op}" if domain else op
        version = model.opset_imports.get(domain, opset) if domain else opset
        jvp = jvp_rules.lookup(domain, op, version) is not None
        tr = transpose_rules.lookup(domain, op, version) is not None
        vm = batch_rules.lookup(domain, op, version) is not None
        for key, ok in (("jvp", jvp), ("vjp", jvp), ("vmap", vm)):
            if not ok:
                missing[key].append(label)
        print(
            f"  {label:<32} {n:>5}  {_yes(jvp):<4} {_yes(jvp):<4} {_yes(tr) if tr else '-':<9} {_yes(vm):<4}"
        )
    print(
        "vjp is linearize + transpose: it needs the jvp rule; the transpose rules serve the "
        "linear operators jvp rules emit ('-': the operator is not linear)."
    )
    for key, ops in missing.items():
        print(f"lacking {key} rules: {', '.join(ops) if ops else 'none'}")
    return 0


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


# ----------------------------------------------------------------------------------------- demo
def _demo(args: argparse.Namespace, progress: Progress) -> int:
    from onnax.demo import format_table, run_demo

    print("onnax demo: a two-layer float64 regression loss, four derived models, each run in")
    print("onnxruntime and compared with central finite differences of the primal model.\n")
    rows = run_demo(seed=args.seed)
    print(format_table(rows))
    print("\nall derivatives agree with finite differences")
    return 0


# --------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``onnax`` command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's default must not overwrite a flag given before the subcommand.
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback"
    )
    common.add_argument(
        "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress on stderr"
    )
    parser = argparse.ArgumentParser(
        prog="onnax",
        description="JAX-style transforms of ONNX models, and derivative families for CasADi.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="run grad, jvp, vjp and jvp(grad) on a built-in model", parents=[common]
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    helps = {
        "grad": "gradient of a rank-0 output",
        "jvp": "forward mode: + fwd_<x> -> + fwd_<y>",
        "vjp": "reverse mode: + adj_<y> -> + adj_<x>",
        "vmap": "map over a new batch dimension",
        "jacfwd": "full Jacobians jac_<y>_<x> by forward mode",
        "jacrev": "full Jacobians jac_<y>_<x> by reverse mode",
        "hessian": "Hessian hess_<y>_<x1>_<x2> of a rank-0 output",
    }
    for name in TRANSFORMS:
        p = sub.add_parser(name, help=f"{helps[name]}: IN.onnx -> OUT.onnx", parents=[common])
        p.add_argument("model", help="input .onnx file")
        p.add_argument("result", help="output .onnx file")
        if name != "vmap":
            p.add_argument("--inputs", help="comma-separated input names (default: float inputs)")
        if name in ("grad", "hessian"):
            p.add_argument("--output", help="the rank-0 output (default: the only one)")
        elif name != "vmap":
            default = (
                "float outputs; on a derivative model, its grad_/fwd_/adj_ outputs"
                if name == "jvp"
                else "float outputs"
            )
            p.add_argument("--outputs", help=f"comma-separated output names (default: {default})")
        if name != "vmap":
            p.add_argument(
                "--stop-gradient",
                help="comma-separated main-graph value names whose derivative is zero "
                "(like jax.lax.stop_gradient)",
            )
        if name in ("grad", "jvp", "vjp"):
            p.add_argument(
                "--accumulate",
                default="model",
                choices=["model", "float32"],
                help="arithmetic of FLOAT16/BFLOAT16 derivatives: the model's types (default) or "
                "sums (reductions, MatMul, Conv, scatter-adds) in float32",
            )
        if name == "vmap":
            p.add_argument(
                "--in-axes",
                help="batch axis per input: 0 (all), 0,None (by position) or x=0,w=None (by name)",
            )
            p.add_argument("--out-axes", help="batch axis per output, same forms (default 0)")
            p.add_argument("--axis-size", type=int, help="fixed batch size (default: symbolic)")
            p.add_argument("--randomness", default="error", choices=["error", "different", "same"])
        p.add_argument(
            "--check",
            action="store_true",
            help="run the result on random inputs against finite differences and print a table",
        )
        p.set_defaults(func=_transform)
    fam = sub.add_parser(
        "family", help="write a CasADi family: IN.onnx -> DIR/f.onnx + siblings", parents=[common]
    )
    fam.add_argument("model", help="input .onnx file")
    fam.add_argument("result", help="the model file to write, e.g. generated/f.onnx")
    fam.add_argument("--layout", default="casadi", choices=["casadi", "onnx"])
    fam.add_argument(
        "--kinds",
        help="comma-separated siblings (default adj,fwd_adj; also fwd, fwd_fwd, adj_adj, jac)",
    )
    fam.add_argument("--inputs", help="differentiable inputs (default: float inputs)")
    fam.add_argument("--outputs", help="outputs (default and required: every float output)")
    fam.add_argument(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="bind a symbolic dimension (N=4) or keep it (N=symbolic); repeatable",
    )
    fam.add_argument(
        "--check", action="store_true", help="re-read the files and check the contract"
    )
    fam.set_defaults(func=_family)
    info = sub.add_parser(
        "info", help="inputs, outputs, operators and rule coverage", parents=[common]
    )
    info.add_argument("model", help="input .onnx file")
    info.set_defaults(func=_info)
    return parser


def _paragraph(err: BaseException, command: str) -> str:
    text = " ".join(str(err).split())
    # Library messages start with the transform's name; the prefix printed says it already.
    if text.startswith(f"{command}: "):
        text = text[len(command) + 2 :]
    return text or type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (2 on any error)."""
    args = build_parser().parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    progress = Progress(quiet=bool(getattr(args, "quiet", False)))
    try:
        return int(args.func(args, progress))
    except Exception as err:
        progress.done()
        if debug:
            traceback.print_exc()
        kind = "" if isinstance(err, OnnaxError) else f"{type(err).__name__}: "
        hint = "" if debug else " (--debug shows the traceback)"
        print(f"onnax {args.command}: {kind}{_paragraph(err, args.command)}{hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
