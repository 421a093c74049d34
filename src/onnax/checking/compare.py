"""``check``: a derived model against oracles that know nothing of the rules.

* jvp, jacfwd, jacrev: ``J v`` against central differences of the source along ``v``;
* vjp and grad: ``<Jᵀ u, v>`` against ``<u, J v>`` from the same differences;
* hessian: ``v1ᵀ H v2`` against second differences;
* vmap: the batched result against a loop of single-example runs of the source.

Differences are taken on the float64 twin of the source where the runtime has its kernels
(:mod:`onnax.checking.reference`), on a ladder of steps (:mod:`onnax.checking.finite`). A row is
judged norm-wise: ``|got - ref| <= rtol·|ref| + floor + 2·spread``, where ``rtol`` depends on
the derived model's element type (2e-3 in float32: a result scaled by 1.01 fails), ``floor`` is
the rounding a quantity of the primal's size carries in that type (times the roundoff the
source itself loses at the point), and ``spread`` is the reference's own uncertainty.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnax.checking import finite
from onnax.checking.batched import check_vmap
from onnax.checking.finite import eps, norm, relative_tolerance
from onnax.checking.points import feeds_for, is_float, np_dtype, random_point
from onnax.checking.reference import Reference, lift
from onnax.checking.result import CheckResult, Row
from onnax.checking.runtime import runner
from onnax.errors import CheckError

__all__ = ["TRANSFORMS", "check", "infer_transform"]

TRANSFORMS = ("grad", "jvp", "vjp", "vmap", "jacfwd", "jacrev", "hessian")

FLOOR = 8.0
"""Units of roundoff, per unit of primal magnitude, that a derived quantity may carry."""

Feeds = dict[str, np.ndarray]
_PREFIXES = {"grad": "grad", "fwd": "jvp", "adj": "vjp", "jac": "jacfwd", "hess": "hessian"}


def _base(name: str) -> str:
    return name.split("_", 1)[1] if "_" in name else name


def infer_transform(source: ir.Model, derived: ir.Model) -> str:
    """The transform that made ``derived`` from ``source``, read from the names it added."""
    known = {str(v.name) for v in source.graph.outputs}
    added = [str(v.name) for v in derived.graph.outputs if v.name not in known]
    if not added and [v.name for v in derived.graph.outputs] == [
        v.name for v in source.graph.outputs
    ]:
        return "vmap"
    for name in added:
        match = re.match(r"([a-z]+?)\d*_", name)
        if match and match.group(1) in _PREFIXES:
            return _PREFIXES[match.group(1)]
    raise CheckError(
        f"check: cannot tell which transform made the derived model from its added outputs "
        f"{added[:5]} (expected grad_, fwd_, adj_, jac_ or hess_ names, or the source's outputs "
        f"for vmap). Pass transform=, one of {list(TRANSFORMS)}."
    )


class _Context:
    """What every row of one check shares: the point, the two runners and the tolerances."""

    def __init__(self, source: ir.Model, derived: ir.Model, bases: set[str], seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.source = source
        self.derived = derived
        self.point = random_point(source, self.rng)
        graph = source.graph
        weights = sorted(b for b in bases if b in graph.initializers and b not in self.point)
        for name in weights:
            tensor = graph.initializers[name].const_value
            if tensor is None:
                raise CheckError(f"check: the initializer {name!r} holds no tensor")
            self.point[name] = tensor.numpy().astype(np.float64)
        self.lifted = lift(source, weights)
        self.f = Reference(self.lifted, self.point)
        self.g, self.g_backend = runner(derived)
        self.y = self.f(self.point)
        self.steps = finite.FIRST_STEPS[self.f.precision]
        self.second_steps = finite.SECOND_STEPS[self.f.precision]

    def run_derived(self, extra: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = self.g(feeds_for(self.derived, {**self.point, **extra}))
        return {k: np.asarray(v, np.float64) if is_float(v.dtype) else v for k, v in got.items()}

    def direction(self, name: str) -> np.ndarray:
        return self.rng.standard_normal(np.shape(self.point[name]))

    def moved(self, shifts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v + shifts[k] if k in shifts else v for k, v in self.point.items()}

    def differences(
        self, direction: Mapping[str, np.ndarray]
    ) -> Callable[[int], dict[str, np.ndarray]]:
        """Central differences along ``direction``, one dict of outputs per rung of the ladder."""
        cache: dict[int, dict[str, np.ndarray]] = {}

        def at(rung: int) -> dict[str, np.ndarray]:
            if rung not in cache:
                h = self.steps[rung]
                plus = self.f(self.moved({k: h * d for k, d in direction.items()}))
                minus = self.f(self.moved({k: -h * d for k, d in direction.items()}))
                cache[rung] = {
                    k: (plus[k] - minus[k]) / (2 * h) for k in plus if plus[k].dtype.kind == "f"
                }
            return cache[rung]

        return at

    def rtol(self, dtype: np.dtype, second_order: bool = False) -> float:
        """The relative tolerance of a row: the derived type's, or the reference's if looser."""
        ref = np.dtype(np.float64 if self.f.precision == "float64" else np.float32)
        return max(relative_tolerance(dtype, second_order), relative_tolerance(ref, second_order))

    def floor(self, dtype: np.dtype, magnitude: float) -> float:
        return FLOOR * eps(dtype) * self.f.amplification * magnitude


def _judge(
    check: str,
    output: str,
    got: np.ndarray | float,
    at: Callable[[int], np.ndarray],
    steps: Sequence[float],
    rtol: float,
    floor: float,
) -> Row:
    settled = finite.settle(at, steps, rtol, floor)
    got_arr = np.asarray(got, np.float64)
    if settled.value is None:
        last = at(len(steps) - 1)
        return Row(
            check,
            output,
            norm(last),
            norm(got_arr - last) if got_arr.shape == last.shape else np.inf,
            rtol * norm(last) + floor,
            "inconclusive",
            f"finite differences at steps {steps[0]:g}..{steps[-1]:g} disagree with each other "
            f"(spread {settled.uncertainty:.1e}): a kink, discontinuity or fast oscillation near this point",
        )
    ref = settled.value
    tolerance = rtol * norm(ref) + floor + 2 * settled.uncertainty
    if got_arr.shape != ref.shape:
        return Row(
            check,
            output,
            norm(ref),
            np.inf,
            tolerance,
            "wrong",
            f"shape {list(got_arr.shape)}, expected {list(ref.shape)}",
        )
    error = norm(got_arr - ref)
    return Row(check, output, norm(ref), error, tolerance, "ok" if error <= tolerance else "wrong")


def _added(source: ir.Model, derived: ir.Model) -> tuple[list[ir.Value], list[ir.Value]]:
    n_in, n_out = len(source.graph.inputs), len(source.graph.outputs)
    return list(derived.graph.inputs)[n_in:], list(derived.graph.outputs)[n_out:]


def _candidates(source: ir.Model) -> set[str]:
    graph = source.graph
    values = [*graph.inputs, *graph.initializers.values()]
    return {str(v.name) for v in values if v.dtype is not None and v.dtype.is_floating_point()}


def _split(body: str, source: ir.Model, candidates: set[str], parts: int) -> list[str] | None:
    """``<y>_<x>`` (parts 1) or ``<y>_<x1>_<x2>`` (parts 2) split along known names."""
    for y in source.graph.outputs:
        prefix = f"{y.name}_"
        if not body.startswith(prefix):
            continue
        rest = body[len(prefix) :]
        if parts == 1 and rest in candidates:
            return [str(y.name), rest]
        for x1 in candidates:
            if parts == 2 and rest.startswith(f"{x1}_") and rest[len(x1) + 1 :] in candidates:
                return [str(y.name), x1, rest[len(x1) + 1 :]]
    return None


def _bases(transform: str, source: ir.Model, derived: ir.Model) -> set[str]:
    added_in, added_out = _added(source, derived)
    candidates = _candidates(source)
    names = {_base(str(v.name)) for v in (*added_in, *added_out)}
    if transform in ("jacfwd", "jacrev", "hessian"):
        for v in added_out:
            split = _split(
                _base(str(v.name)), source, candidates, 2 if transform == "hessian" else 1
            )
            names.update(split or [])
    return names & candidates


def _pick(
    at: Callable[[int], dict[str, np.ndarray]], name: str, total: bool = False
) -> Callable[[int], np.ndarray]:
    """One output of a ladder of differences (its sum, for a loss)."""

    def one(rung: int) -> np.ndarray:
        value = at(rung)[name]
        return np.asarray(np.sum(value)) if total else value

    return one


def _seeded(
    at: Callable[[int], dict[str, np.ndarray]], cotangents: Mapping[str, np.ndarray]
) -> Callable[[int], np.ndarray]:
    """``sum_y <u_y, J_y v>`` from a ladder of differences along ``v``."""

    def dot(rung: int) -> np.ndarray:
        moved = at(rung)
        return np.asarray(sum(float(np.sum(u * moved[y])) for y, u in cotangents.items()))

    return dot


def _check_jvp(
    ctx: _Context, added_in: list[ir.Value], added_out: list[ir.Value], skipped: list[str]
) -> list[Row]:
    tangents = {
        str(t.name): ctx.direction(_base(str(t.name)))
        for t in added_in
        if _base(str(t.name)) in ctx.point
    }
    for t in added_in:
        if str(t.name) not in tangents:
            skipped.append(
                f"{t.name}: no input or initializer {_base(str(t.name))!r} in the source"
            )
    # The tangents, rounded to the tangent inputs' types, are the directions differenced.
    typed = feeds_for(ctx.derived, tangents)
    direction = {_base(k): v.astype(np.float64) for k, v in typed.items()}
    got = ctx.run_derived(typed)
    at = ctx.differences(direction)
    rows = []
    for o in added_out:
        y = _base(str(o.name))
        if y not in ctx.y:
            skipped.append(f"{o.name}: the source has no output {y!r}")
            continue
        dtype = np_dtype(o)
        rows.append(
            _judge(
                "jvp",
                str(o.name),
                got[str(o.name)],
                _pick(at, y),
                ctx.steps,
                ctx.rtol(dtype),
                ctx.floor(dtype, norm(ctx.y[y])),
            )
        )
    return rows


def _check_pullback(
    ctx: _Context,
    transform: str,
    loss: str | None,
    added_in: list[ir.Value],
    added_out: list[ir.Value],
    skipped: list[str],
) -> list[Row]:
    seeds: Feeds = {}
    for t in added_in:
        y = _base(str(t.name))
        if y not in ctx.y:
            skipped.append(f"{t.name}: the source has no output {y!r}")
            continue
        seeds[str(t.name)] = ctx.rng.standard_normal(np.shape(ctx.y[y]))
    typed = feeds_for(ctx.derived, seeds)
    cotangents = {_base(k): v.astype(np.float64) for k, v in typed.items()}
    got = ctx.run_derived(typed)
    rows = []
    for o in added_out:
        x = _base(str(o.name))
        if x not in ctx.point:
            skipped.append(f"{o.name}: no input or initializer {x!r} in the source")
            continue
        v = ctx.direction(x)
        at = ctx.differences({x: v})
        pulled = got[str(o.name)]
        if pulled.shape != v.shape:
            rows.append(
                Row(
                    transform,
                    str(o.name),
                    0.0,
                    np.inf,
                    0.0,
                    "wrong",
                    f"shape {list(pulled.shape)}, expected {list(v.shape)}",
                )
            )
            continue
        dot_terms = float(np.sum(np.abs(pulled * v)))
        if transform == "grad":
            if loss is None:
                raise CheckError("check: grad needs its loss output; pass output=<name>.")
            primal = abs(float(np.sum(ctx.y[loss])))
            along = _pick(at, loss, total=True)
        else:
            primal = sum(float(np.sum(np.abs(u * ctx.y[y]))) for y, u in cotangents.items())
            along = _seeded(at, cotangents)
        dtype = np_dtype(o)
        rows.append(
            _judge(
                transform,
                str(o.name),
                float(np.sum(pulled * v)),
                along,
                ctx.steps,
                ctx.rtol(dtype),
                ctx.floor(dtype, primal + dot_terms),
            )
        )
    return rows


def _second_differences(
    ctx: _Context, y: str, first: tuple[str, np.ndarray], other: tuple[str, np.ndarray]
) -> Callable[[int], np.ndarray]:
    """``v1ᵀ H v2`` of the output ``y`` by central second differences, per rung."""
    (x1, v1), (x2, v2) = first, other

    def second(rung: int) -> np.ndarray:
        step = ctx.second_steps[rung]

        def value(s1: float, s2: float) -> float:
            shifts = {x1: s1 * step * v1}
            shifts[x2] = shifts.get(x2, 0.0) + s2 * step * v2  # x1 == x2 moves both ways
            return float(np.sum(ctx.f(ctx.moved(shifts))[y]))

        both = value(1, 1) - value(1, -1) - value(-1, 1) + value(-1, -1)
        return np.asarray(both / (4 * step * step))

    return second


def _check_jacobians(
    ctx: _Context, transform: str, added_out: list[ir.Value], skipped: list[str]
) -> list[Row]:
    tensors = ctx.run_derived({})
    candidates = set(ctx.point) & _candidates(ctx.source)
    rows = []
    for o in added_out:
        name = str(o.name)
        dtype = np_dtype(o)
        parts = _split(_base(name), ctx.source, candidates, 2 if transform == "hessian" else 1)
        if parts is None:
            skipped.append(
                f"{name}: not a {'hess_<y>_<x1>_<x2>' if transform == 'hessian' else 'jac_<y>_<x>'} name of the source"
            )
            continue
        if transform != "hessian":
            y, x = parts
            v = ctx.direction(x)
            jac = tensors[name]
            got = (
                np.tensordot(jac, v, axes=v.ndim)
                if jac.shape[jac.ndim - v.ndim :] == v.shape
                else jac
            )
            at = ctx.differences({x: v})
            rows.append(
                _judge(
                    transform,
                    name,
                    got,
                    _pick(at, y),
                    ctx.steps,
                    ctx.rtol(dtype),
                    ctx.floor(dtype, norm(ctx.y[y])),
                )
            )
            continue
        y, x1, x2 = parts
        v1, v2 = ctx.direction(x1), ctx.direction(x2)
        h = tensors[name]
        if h.shape != (*v1.shape, *v2.shape):
            rows.append(
                Row(
                    transform,
                    name,
                    0.0,
                    np.inf,
                    0.0,
                    "wrong",
                    f"shape {list(h.shape)}, expected {[*v1.shape, *v2.shape]}",
                )
            )
            continue
        second_got = float(np.tensordot(np.tensordot(h, v2, axes=v2.ndim), v1, axes=v1.ndim))
        terms = float(
            np.tensordot(
                np.tensordot(np.abs(h), np.abs(v2), axes=v2.ndim), np.abs(v1), axes=v1.ndim
            )
        )

        second = _second_differences(ctx, y, (x1, v1), (x2, v2))
        rows.append(
            _judge(
                transform,
                name,
                second_got,
                second,
                ctx.second_steps,
                ctx.rtol(dtype, True),
                ctx.floor(dtype, abs(float(np.sum(ctx.y[y]))) + terms),
            )
        )
    return rows


def _loss_name(source: ir.Model, output: str | None) -> str:
    if output is not None:
        return output
    scalars = [
        str(y.name) for y in source.graph.outputs if y.shape is not None and y.shape.rank() == 0
    ]
    if len(scalars) != 1:
        raise CheckError(
            f"check: grad needs the loss output, and the source has {len(scalars)} rank-0 "
            f"outputs {scalars}. Pass output=<name> (on the command line, --output)."
        )
    return scalars[0]


def check(
    model: ir.Model,
    derived: ir.Model,
    transform: str | None = None,
    *,
    output: str | None = None,
    in_axes: Any = 0,
    out_axes: Any = 0,
    axis_size: int | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> CheckResult:
    """Checks a derived model numerically against its source, at one random point.

    Derivatives are compared with central finite differences of the source (on its float64
    twin when the runtime has the kernels), vmap results with a loop of single-example runs.
    Each row is ``"ok"``, ``"wrong"`` or ``"inconclusive"`` (the differences disagree across
    steps, as next to a kink: try another ``seed``). Weights selected as ``inputs`` of the
    transform are differenced at their stored values.

    Args:
        model: The source model the transform was applied to; it is not modified.
        derived: The transform's result.
        transform: One of ``grad``, ``jvp``, ``vjp``, ``vmap``, ``jacfwd``, ``jacrev``,
            ``hessian``. Default: read from the names ``derived`` added.
        output: For ``grad``: the loss output. Default: the only rank-0 output.
        in_axes: For ``vmap``: the ``in_axes`` it was given.
        out_axes: For ``vmap``: the ``out_axes`` it was given.
        axis_size: For ``vmap``: the batch size (default 3 when it was symbolic).
        seed: Seed of the random point and directions.
        progress: Called with a short message before each stage.

    Returns:
        A :class:`CheckResult`; ``result.ok`` says whether every row agreed.

    Raises:
        CheckError: The transform is unknown or cannot be inferred, or grad's loss is ambiguous.
    """
    from onnax.passes.prepare import prepare

    say = progress or (lambda _message: None)
    transform = transform or infer_transform(model, derived)
    if transform not in TRANSFORMS:
        raise CheckError(
            f"check: unknown transform {transform!r}; expected one of {list(TRANSFORMS)}."
        )
    try:
        source = prepare(model, transform)  # typed outputs: the shapes the seeds take
    except Exception:
        # prepare refuses what no transform accepts; a derived model exists, so the source
        # as given (untyped outputs take their shapes from a first run) still serves.
        source = model
    if transform == "vmap":
        say("check: running examples one by one")
        rows, reference = check_vmap(source, derived, in_axes, out_axes, axis_size, seed)
        return CheckResult("vmap", tuple(rows), reference, seed)
    say("check: building sessions")
    ctx = _Context(source, derived, _bases(transform, source, derived), seed)
    added_in, added_out = _added(source, derived)
    skipped: list[str] = []
    say(f"check: {transform} against finite differences")
    if transform == "jvp":
        rows = _check_jvp(ctx, added_in, added_out, skipped)
    elif transform in ("vjp", "grad"):
        loss = _loss_name(source, output) if transform == "grad" else None
        rows = _check_pullback(ctx, transform, loss, added_in, added_out, skipped)
    else:
        rows = _check_jacobians(ctx, transform, added_out, skipped)
    reference = f"central differences of {ctx.f.description}; the derived model in {ctx.g_backend}"
    return CheckResult(transform, tuple(rows), reference, seed, tuple(skipped))
