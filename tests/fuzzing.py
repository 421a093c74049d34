"""The random-graph fuzzer: generator (:mod:`fuzz_graphs`), validation, checker and shrinker.

:func:`generate` draws a random valid float graph and keeps only sample points where the
oracles are meaningful (:func:`validate`: finite, moderate values, away from every kink).
:func:`check` runs every transform and composition on it against the oracles of
:mod:`oracles`, and checks that the source is untouched and the result deterministic. Each
stage gets one outcome:

* ``ok``;
* ``refused``: an :class:`onnax.OnnaxError` whose message names ``domain::Op`` and a remedy;
* ``crash``: any other exception, a badly worded refusal, or an invalid generated model;
* ``wrong``: an oracle disagrees;
* ``mutated``: the source serialises differently after the transform;
* ``nondeterministic``: a repeat, or the same transform of a save/load round trip of the source,
  gives different bytes.

:func:`shrink` deletes nodes (their outputs become graph inputs), reroutes a node's consumers to
one of its inputs and drops outputs while the same stage still fails the same way.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx_ir as ir

import onnax
from fuzz_generator import Generator
from fuzz_graphs import BATCH, Const, Kink, Op, Spec, Val, broadcast
from oracles import (
    check_adjoint,
    check_grad,
    check_jvp,
    check_model_valid,
    check_vjp,
    check_vmap,
    run,
)

__all__ = ["FAILURES", "STAGES", "Outcome", "check", "generate", "shrink", "validate"]

STAGES = ("jvp", "vjp", "grad", "vmap", "jvp(grad)", "vmap(grad)", "vmap(jvp)")
FAILURES = ("crash", "wrong", "mutated", "nondeterministic")
_OPERATOR = re.compile(r"\b[\w.]+::[A-Z]\w*")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one stage did: ``kind`` is ok/refused/crash/wrong/mutated/nondeterministic."""

    stage: str
    kind: str
    detail: str = ""
    error: str = ""  # the exception's type, so a shrink keeps the same failure

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES


# --- generation and validation ---------------------------------------------------------------
def validate(spec: Spec) -> str | None:
    """None when the oracles are meaningful at the spec's sample point, else why not."""
    try:
        model = ir.from_onnx_text(spec.text(expose=True))
        check_model_valid(model)
        got = run(model, spec.feeds())
    except Exception as e:  # any failure means: draw another graph
        return f"invalid: {type(e).__name__}: {str(e)[:200]}"
    vals = spec.values()
    feeds = spec.feeds()
    values = {**feeds, **got}
    for name, arr in got.items():
        want = tuple(spec.batch if d == BATCH else d for d in vals[name].shape)
        if arr.shape != want:
            return f"generator bug: {name} has shape {arr.shape}, declared {want}"
        if not np.all(np.isfinite(arr)) or np.max(np.abs(arr), initial=0.0) > 1e3:
            return f"ill-conditioned: {name}"
    consts = {c.name: c.data for c in spec.consts}
    margin = 0.25 if spec.dtype == "float" else 0.02
    for op in spec.ops:
        for kink in op.kinks:
            arrays = [values[n] if n in values else consts[n] for n in kink.values]
            if not _clear_of(kink, arrays, margin):
                return f"near a kink: {op.text.split('=')[0].strip()}"
    return None


def _clear_of(kink: Kink, arrays: list[np.ndarray], margin: float) -> bool:
    a = arrays[0].astype(np.float64)
    if kink.kind == "abs":
        return all(np.all(np.abs(a - o) > margin) for o in kink.params)
    if kink.kind == "gap":
        return bool(np.all(np.abs(a - arrays[1].astype(np.float64)) > margin))
    if kink.kind == "top":
        axes = tuple(int(x) for x in kink.params)
        rest = [i for i in range(a.ndim) if i not in axes]
        flat = np.transpose(a, rest + list(axes)).reshape(*[a.shape[i] for i in rest], -1)
    else:  # pool: non-overlapping k x k windows over the trailing spatial axes
        k = int(kink.params[0])
        nd = a.ndim - 2
        crop = a[(..., *[slice(0, (s // k) * k) for s in a.shape[2:]])]
        shape = list(crop.shape[:2])
        for s in crop.shape[2:]:
            shape += [s // k, k]
        win = crop.reshape(shape)
        order = [0, 1] + [2 + 2 * i for i in range(nd)] + [3 + 2 * i for i in range(nd)]
        flat = win.transpose(order).reshape(*win.shape[:2], *[s // k for s in crop.shape[2:]], -1)
    if flat.shape[-1] < 2:
        return True
    s = np.sort(flat, axis=-1)
    return bool(np.all(s[..., -1] - s[..., -2] > margin) and np.all(s[..., 1] - s[..., 0] > margin))


def generate(seed: int, nodes: int | None = None, attempts: int = 50) -> Spec:
    """A random graph whose sample point passes :func:`validate` (drawn from ``seed``'s stream)."""
    for k in range(attempts):
        spec = Generator(zlib.crc32(f"{seed}/{k}".encode())).build(nodes)
        spec.seed = seed
        if validate(spec) is None:
            return spec
    raise RuntimeError(f"no valid graph for seed {seed} in {attempts} attempts")


# --- the checker ------------------------------------------------------------------------------
def _bytes(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString(deterministic=True)


def _reload(model: ir.Model) -> ir.Model:
    return ir.from_proto(onnx.load_from_string(_bytes(model)))


def _refusal_ok(message: str) -> bool:
    return bool(_OPERATOR.search(message)) and "remedy" in message.lower()


def _stage(
    stage: str,
    source: ir.Model,
    build: Callable[[ir.Model], ir.Model],
    oracle: Callable[[ir.Model], object],
) -> tuple[Outcome, ir.Model | None]:
    before = _bytes(source)
    try:
        built = build(source)
    except onnax.OnnaxError as e:
        if _refusal_ok(str(e)):
            return Outcome(stage, "refused", str(e)[:300], type(e).__name__), None
        return Outcome(stage, "crash", f"badly worded refusal: {e}", type(e).__name__), None
    except Exception as e:  # a crash is an outcome
        return Outcome(stage, "crash", _short(e), type(e).__name__), None
    if _bytes(source) != before:
        return Outcome(stage, "mutated", "the source serialises differently"), built
    try:
        out = _bytes(built)
        if _bytes(build(source)) != out:
            return Outcome(stage, "nondeterministic", "a repeat gives other bytes"), built
        if _bytes(build(_reload(source))) != out:
            return Outcome(stage, "nondeterministic", "a reloaded source gives other bytes"), built
        oracle(built)
    except AssertionError as e:
        return Outcome(stage, "wrong", str(e)[:600], "AssertionError"), built
    except Exception as e:
        return Outcome(stage, "crash", _short(e), type(e).__name__), built
    return Outcome(stage, "ok"), built


def _short(e: Exception) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    where = next(
        (
            f"{f.filename.split('/src/')[-1]}:{f.lineno}"
            for f in reversed(frames)
            if "/src/onnax/" in f.filename
        ),
        "",
    )
    return f"{type(e).__name__}: {str(e)[:400]} {where}".strip()


def _names(model: ir.Model, expected: list[str]) -> None:
    """The naming contract: primal outputs first, then ``<prefix><name>`` per selection."""
    got = [v.name for v in model.graph.outputs]
    assert got == expected, f"output names {got}, expected {expected}"


def _axes(spec: Spec) -> tuple[list[int | None], int]:
    """in_axes per graph input (floats then flags) and one out_axes.

    Each input's axis is drawn from the seed and its name, so that it survives shrinking.
    """
    axes: list[int | None] = []
    for v in spec.inputs:
        rng = np.random.default_rng([spec.seed, 7, zlib.crc32(v.name.encode())])
        choices: list[int | None] = [0, 0, -1, None] + ([1] if v.shape else [])
        axes.append(choices[int(rng.integers(0, len(choices)))])
    if all(a is None for a in axes):
        axes[0] = 0
    for f in spec.flags:
        rng = np.random.default_rng([spec.seed, 7, zlib.crc32(f.encode())])
        axes.append(0 if rng.random() < 0.3 else None)
    return axes, int(np.random.default_rng([spec.seed, 8]).choice([0, -1]))


def _twin(spec: Spec) -> ir.Model | None:
    """The float64 rendering of a float32 spec, when onnxruntime has kernels for all of it."""
    if spec.dtype != "float":
        return None
    twin = ir.from_onnx_text(spec.text("double"))
    try:
        run(twin, spec.feeds("double"))
    except Exception:  # onnxruntime has float kernels only for Conv, Erf, Softplus...
        return None
    return twin


def check(spec: Spec, stages: Sequence[str] = STAGES) -> list[Outcome]:
    """Every requested stage on ``spec``; compositions are skipped when their inner stage fails.

    The finite-difference oracles of a float32 graph run on its float64 twin (the same graph in
    double, transformed the same way) where onnxruntime can run it: float32 differences with
    ``eps = 1e-2`` are too coarse for a deep graph's curvature. The float32 results must still
    be valid models that onnxruntime loads; vmap is checked in the graph's own type.
    """
    model = ir.from_onnx_text(spec.text())
    feeds = spec.feeds()
    floats = [v.name for v in spec.inputs]
    outs = list(spec.outputs)
    in_axes, out_axes = _axes(spec)
    results: list[Outcome] = []
    wanted = set(stages)
    built: dict[str, ir.Model | None] = {}
    twin = _twin(spec)
    twin_feeds = spec.feeds("double") if twin is not None else feeds
    sources: dict[str, ir.Model] = {"": model}
    twins: dict[str, ir.Model] = {"": twin} if twin is not None else {}

    def stage(name: str, src: ir.Model, build: Callable, oracle: Callable) -> None:
        outcome, m = _stage(name, src, build, oracle)
        built[name] = m if outcome.kind == "ok" else None
        if name in wanted:
            results.append(outcome)

    def numeric(name: str, src: str, build: Callable, check: Callable) -> Callable:
        """The oracle ``check(source, feeds, built)``, on the float64 twin if there is one."""

        def oracle(b: ir.Model) -> None:
            if twin is None:
                check(sources[src], feeds, b)
                return
            check_model_valid(b)  # the float32 result: valid, and onnxruntime loads it
            twins[name] = build(twins[src])
            check(twins[src], twin_feeds, twins[name])

        return oracle

    if wanted & {"jvp", "vjp", "vmap(jvp)"}:
        build = lambda m: onnax.jvp(m, floats, outs)  # noqa: E731
        stage(
            "jvp",
            model,
            build,
            numeric(
                "jvp",
                "",
                build,
                lambda src, f, b: (
                    _names(b, [*outs, *(f"fwd_{y}" for y in outs)]),
                    check_jvp(src, f, floats, outs, transformed=b),
                ),
            ),
        )
    if "vjp" in wanted:

        def vjp_check(src: ir.Model, f: dict, b: ir.Model) -> None:
            _names(b, [*outs, *(f"adj_{x}" for x in floats)])
            check_vjp(src, f, floats, outs, transformed=b)
            jm = (twins if twin is not None else built).get("jvp")
            if jm is not None:
                check_adjoint(src, f, floats, outs, built=(jm, b))

        build = lambda m: onnax.vjp(m, floats, outs)  # noqa: E731
        stage("vjp", model, build, numeric("vjp", "", build, vjp_check))
    loss = "loss" if "loss" in outs else None
    if loss and wanted & {"grad", "jvp(grad)", "vmap(grad)"}:
        build = lambda m: onnax.grad(m, floats, loss)  # noqa: E731
        stage(
            "grad",
            model,
            build,
            numeric(
                "grad",
                "",
                build,
                lambda src, f, b: (
                    _names(b, [*outs, *(f"grad_{x}" for x in floats)]),
                    check_grad(src, f, floats, loss, transformed=b),
                ),
            ),
        )
    if "vmap" in wanted:
        stage(
            "vmap",
            model,
            lambda m: onnax.vmap(m, in_axes=tuple(in_axes), out_axes=out_axes),
            lambda b: check_vmap(model, feeds, tuple(in_axes), out_axes, transformed=b),
        )
    gm = built.get("grad")
    if gm is not None:
        sources["grad"] = gm
        grads = [v.name for v in gm.graph.outputs][len(outs) :]
        if "jvp(grad)" in wanted:
            build = lambda m: onnax.jvp(m, floats, grads)  # noqa: E731
            stage(
                "jvp(grad)",
                gm,
                build,
                numeric(
                    "jvp(grad)",
                    "grad",
                    build,
                    lambda src, f, b: check_jvp(src, f, floats, grads, transformed=b),
                ),
            )
        if "vmap(grad)" in wanted:
            stage(
                "vmap(grad)",
                gm,
                lambda m: onnax.vmap(m, in_axes=tuple(in_axes), out_axes=out_axes),
                lambda b: check_vmap(gm, feeds, tuple(in_axes), out_axes, transformed=b),
            )
    jm = built.get("jvp")
    if jm is not None and "vmap(jvp)" in wanted:
        rng = np.random.default_rng([spec.seed, 11])
        tangents = {
            f"fwd_{x}": rng.standard_normal(feeds[x].shape).astype(feeds[x].dtype) for x in floats
        }
        jfeeds = {**feeds, **tangents}
        jaxes = (*in_axes, *[0] * len(tangents))
        stage(
            "vmap(jvp)",
            jm,
            lambda m: onnax.vmap(m, in_axes=jaxes, out_axes=out_axes),
            lambda b: check_vmap(jm, jfeeds, jaxes, out_axes, transformed=b),
        )
    return results


# --- the shrinker -----------------------------------------------------------------------------
def _rename(op: Op, old: str, new: str) -> Op:
    pattern = re.compile(rf"\b{re.escape(old)}\b")
    return dataclasses.replace(
        op,
        text=pattern.sub(new, op.text),
        reads=tuple(new if r == old else r for r in op.reads),
        kinks=tuple(
            dataclasses.replace(k, values=tuple(new if v == old else v for v in k.values))
            for k in op.kinks
        ),
    )


def _prune(spec: Spec, dead_nodes: bool = True) -> Spec:
    """Drop the nodes (if ``dead_nodes``) and initializers no output depends on.

    Unused inputs stay, and dead nodes on request: some failures need them (a Loop whose result
    is unused); :func:`_candidates` also drops them one at a time.
    """
    live = set(spec.outputs)
    ops: list[Op] = []
    for op in reversed(spec.ops):
        if any(v.name in live for v in op.outs) or not dead_nodes:
            ops.append(op)
            live.update(op.reads)
    ops.reverse()
    return dataclasses.replace(
        spec,
        ops=ops,
        flags=[f for f in spec.flags if f in live],
        consts=[c for c in spec.consts if c.name in live],
    )


def _candidates(spec: Spec) -> list[Spec]:
    out: list[Spec] = [_prune(spec)]
    read = {r for op in spec.ops for r in op.reads} | set(spec.outputs)
    for i, v in enumerate(spec.inputs):
        if v.name not in read and len(spec.inputs) > 1:
            out.append(dataclasses.replace(spec, inputs=spec.inputs[:i] + spec.inputs[i + 1 :]))
    for i in range(len(spec.outputs)):
        if len(spec.outputs) > 1:
            out.append(dataclasses.replace(spec, outputs=spec.outputs[:i] + spec.outputs[i + 1 :]))
    for i in reversed(range(len(spec.ops))):
        op = spec.ops[i]
        rest = spec.ops[:i] + spec.ops[i + 1 :]
        # Reroute: the consumers read one of the node's inputs of the same shape instead.
        if len(op.outs) == 1:
            vals = spec.values()
            for r in op.reads:
                if r in vals and vals[r].shape == op.outs[0].shape:
                    y = op.outs[0].name
                    out.append(
                        dataclasses.replace(
                            spec,
                            ops=[_rename(o, y, r) for o in rest],
                            outputs=[r if o == y else o for o in spec.outputs],
                        )
                    )
        if not any(v.name in read for v in op.outs):
            out.append(dataclasses.replace(spec, ops=rest))  # a dead node
            continue
        # Cut: the node's outputs become graph inputs.
        cut = [v for v in op.outs if v.name in read]
        out.append(dataclasses.replace(spec, ops=rest, inputs=spec.inputs + cut))
    same = _bytes_of(spec)
    return [p for p in (_prune(c, dead_nodes=False) for c in out) if _bytes_of(p) != same]


def _bytes_of(spec: Spec) -> str:
    return spec.text()


def shrink(
    spec: Spec,
    failure: Outcome,
    budget: int = 400,
    progress: Callable[[Spec], None] | None = None,
) -> Spec:
    """A smaller spec on which ``failure.stage`` still fails as ``failure.kind``.

    ``progress`` is called with each smaller failing spec (a caller with a deadline keeps the
    last one); ``budget`` bounds the candidates tried.
    """

    def fails(s: Spec) -> bool:
        if validate(s) is not None:
            return False
        try:
            got = check(s, [failure.stage])
        except Exception:  # a candidate the checker cannot even build
            return False
        return any(o.kind == failure.kind and o.error == failure.error for o in got)

    best = spec
    trials = 0
    shrunk = True
    while shrunk and trials < budget:
        shrunk = False
        for cand in _candidates(best):
            trials += 1
            if fails(cand):
                best = cand
                shrunk = True
                if progress:
                    progress(best)
                break
            if trials >= budget:
                break
    return best


def reproducer(spec: Spec) -> str:
    """The spec as ONNX text (``onnx.printer``), with what its inputs are fed."""
    text = onnx.printer.to_text(ir.to_proto(ir.from_onnx_text(spec.text())))
    feeds = ", ".join(
        f"{v.name}: {'uniform(0.5, 2)' if v.positive else 'normal'}" for v in spec.inputs
    )
    return f"{text}\n# feeds (seed {spec.seed}, N={spec.batch}): {feeds}; flags {spec.flags}"


__all__ += ["BATCH", "Const", "Generator", "Kink", "Op", "Spec", "Val", "broadcast", "reproducer"]
