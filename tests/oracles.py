"""Test oracles that know nothing of the rule table.

* ``fd_jvp``: float64 central finite differences of the primal model, run through onnxruntime.
* ``check_jvp`` / ``check_vjp``: compare the transformed models against those differences.
* ``check_adjoint``: ``<u, J v> == <Jᵀ u, v>`` between independently built jvp and vjp models.
* ``check_model_valid``: ``onnx.checker`` (full check) and an onnxruntime session.
* ``contract_checked``: every transform the oracles build leaves its source byte-identical and
  gives byte-identical results on repeat and on a save/load round trip of the source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

import onnax

Feeds = Mapping[str, np.ndarray]


def session(model: ir.Model | onnx.ModelProto) -> ort.InferenceSession:
    proto = model if isinstance(model, onnx.ModelProto) else ir.to_proto(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def run(model: ir.Model, feeds: Feeds) -> dict[str, np.ndarray]:
    sess = session(model)
    wanted = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return {o.name: r for o, r in zip(sess.get_outputs(), outs, strict=True)}


def check_model_valid(model: ir.Model) -> None:
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    session(proto)


def serialized(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString()


def contract_checked(transform: Callable[[ir.Model], ir.Model], model: ir.Model) -> ir.Model:
    """``transform(model)``, checked for source isolation and determinism.

    The source must serialise byte for byte the same afterwards; a second run on the same object
    and a run on a reloaded copy (``jvp(g)`` against ``jvp(reload(g))``) must give the same bytes.
    """
    before = serialized(model)
    result = transform(model)
    assert serialized(model) == before, "the transform changed its source model"
    out = serialized(result)
    assert serialized(transform(model)) == out, "a second run gave another model"
    reloaded = ir.from_proto(onnx.load_from_string(before))
    assert serialized(transform(reloaded)) == out, "the reloaded source gave another model"
    return result


def io_name(model: ir.Model, index: int, kind: str = "outputs") -> str:
    return getattr(model.graph, kind)[index].name


def _initializer_arrays(model: ir.Model) -> dict[str, np.ndarray]:
    return {
        n: v.const_value.numpy()
        for n, v in model.graph.initializers.items()
        if v.const_value is not None
    }


def _with_initializers_as_inputs(model: ir.Model, names: Sequence[str]) -> ir.Model:
    """A copy where the named initializers are graph inputs, so that FD can perturb them."""
    if not names:
        return model
    copy = ir.from_proto(ir.to_proto(model))
    for n in names:
        v = copy.graph.initializers.pop(n)
        v.const_value = None
        if v not in copy.graph.inputs:
            copy.graph.inputs.append(v)
    return copy


def fd_jvp(
    model: ir.Model,
    feeds: Feeds,
    tangents: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    eps: float | None = None,
) -> dict[str, np.ndarray]:
    """Central differences (f(x + e t) - f(x - e t)) / 2e along the direction ``tangents``."""
    inits = _initializer_arrays(model)
    init_names = [n for n in tangents if n in inits and n not in feeds]
    m = _with_initializers_as_inputs(model, init_names)
    base = {**feeds, **{n: inits[n] for n in init_names}}
    sess = session(m)
    names = [o.name for o in sess.get_outputs()]
    dtype = next(iter(tangents.values())).dtype
    if eps is None:
        eps = 1e-6 if dtype == np.float64 else 1e-2

    def f(sign: float) -> dict[str, np.ndarray]:
        shifted = dict(base)
        for n, t in tangents.items():
            shifted[n] = np.asarray(
                base[n].astype(np.float64) + sign * eps * t.astype(np.float64)
            ).astype(base[n].dtype)
        wanted = {i.name for i in sess.get_inputs()}
        res = sess.run(None, {k: v for k, v in shifted.items() if k in wanted})
        return dict(zip(names, res, strict=True))

    plus, minus = f(1.0), f(-1.0)
    return {
        y: (plus[y].astype(np.float64) - minus[y].astype(np.float64)) / (2 * eps) for y in outputs
    }


def random_like(
    rng: np.random.Generator, value: ir.Value, dims: Mapping[str, int] | None = None
) -> np.ndarray:
    shape = [d if isinstance(d, int) else (dims or {}).get(str(d), 3) for d in value.shape.dims]
    return rng.standard_normal(shape).astype(value.dtype.numpy())


def selected_names(
    model: ir.Model, inputs: Sequence[str] | None, outputs: Sequence[str] | None
) -> tuple[list[str], list[str]]:
    """The selection a transform makes by default: float non-initializer inputs, float outputs."""
    g = model.graph
    floats = (ir.DataType.FLOAT, ir.DataType.DOUBLE)
    in_names = (
        list(inputs)
        if inputs is not None
        else [v.name for v in g.inputs if v.dtype in floats and v.name not in g.initializers]
    )
    out_names = (
        list(outputs) if outputs is not None else [v.name for v in g.outputs if v.dtype in floats]
    )
    return in_names, out_names


def jvp_default_outputs(model: ir.Model) -> list[str]:
    """The outputs jvp differentiates by default (the seed contract of higher derivatives).

    Float outputs named ``<fwd|adj|grad><level>_<a name of the model>`` when there are any (a
    grad model's ``grad_w``), otherwise every float output.
    """
    g = model.graph
    names = {v.name for v in (*g.inputs, *g.outputs)} | set(g.initializers)
    _, floats = selected_names(model, [], None)
    generated = []
    for y in floats:
        head, _, rest = y.partition("_")
        kind = head.rstrip("0123456789")
        if kind in ("fwd", "adj", "grad") and rest in names and head[len(kind) :] != "1":
            generated.append(y)
    return generated or floats


def tolerances(dtype: np.dtype) -> dict[str, float]:
    # float32 differences with eps=1e-2 carry O(eps^2) truncation and O(1e-7/eps) rounding error.
    return {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float64 else {"rtol": 3e-2, "atol": 3e-3}


def check_jvp(
    model: ir.Model,
    feeds: Feeds,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    seed: int = 0,
    transformed: ir.Model | None = None,
) -> ir.Model:
    """jvp(model) against central differences; returns the jvp model.

    ``transformed`` is an already built ``jvp(model, inputs, outputs)`` to check instead.
    """
    rng = np.random.default_rng(seed)
    jm = transformed
    if jm is None:
        jm = contract_checked(lambda m: onnax.jvp(m, inputs, outputs), model)
    check_model_valid(jm)
    g = model.graph
    n_in, n_out = len(g.inputs), len(g.outputs)
    tangent_inputs = list(jm.graph.inputs)[n_in:]
    tangent_outputs = list(jm.graph.outputs)[n_out:]
    in_names, out_names = selected_names(model, inputs, outputs)
    if outputs is None:
        out_names = jvp_default_outputs(model)
    inits = _initializer_arrays(model)
    tangents = {}
    for x, t in zip(in_names, tangent_inputs, strict=True):
        ref = feeds[x] if x in feeds else inits[x]
        tangents[x] = np.asarray(rng.standard_normal(ref.shape)).astype(ref.dtype)
        feeds = {**feeds, t.name: tangents[x]}
    got = run(jm, feeds)
    expected = fd_jvp(model, feeds, tangents, out_names)
    for y, t in zip(out_names, tangent_outputs, strict=True):
        dtype = got[t.name].dtype
        assert got[t.name].shape == expected[y].shape, (
            t.name,
            got[t.name].shape,
            expected[y].shape,
        )
        np.testing.assert_allclose(
            got[t.name], expected[y], **tolerances(dtype), err_msg=f"jvp {y}"
        )
    primal = run(model, feeds)
    for y in primal:
        np.testing.assert_allclose(got[y], primal[y], rtol=1e-6, atol=1e-6)
    return jm


def check_vjp(
    model: ir.Model,
    feeds: Feeds,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    seed: int = 1,
    transformed: ir.Model | None = None,
) -> ir.Model:
    """vjp(model) against central differences, one FD direction per input: <adj_x, t> = <adj_y, J t>.

    ``transformed`` is an already built ``vjp(model, inputs, outputs)`` to check instead.
    """
    rng = np.random.default_rng(seed)
    vm = transformed
    if vm is None:
        vm = contract_checked(lambda m: onnax.vjp(m, inputs, outputs), model)
    check_model_valid(vm)
    g = model.graph
    n_in, n_out = len(g.inputs), len(g.outputs)
    seeds_in = list(vm.graph.inputs)[n_in:]
    ct_out = list(vm.graph.outputs)[n_out:]
    in_names, out_names = selected_names(model, inputs, outputs)
    primal = run(model, feeds)
    seeds = {}
    for y, s in zip(out_names, seeds_in, strict=True):
        seeds[y] = np.asarray(rng.standard_normal(primal[y].shape)).astype(primal[y].dtype)
        feeds = {**feeds, s.name: seeds[y]}
    got = run(vm, feeds)
    inits = _initializer_arrays(model)
    for x, c in zip(in_names, ct_out, strict=True):
        ref = feeds[x] if x in feeds else inits[x]
        assert got[c.name].shape == ref.shape, (c.name, got[c.name].shape, ref.shape)
        direction = np.asarray(rng.standard_normal(ref.shape)).astype(ref.dtype)
        jt = fd_jvp(model, feeds, {x: direction}, out_names)
        lhs = float(np.sum(got[c.name].astype(np.float64) * direction))
        rhs = sum(float(np.sum(seeds[y].astype(np.float64) * jt[y])) for y in out_names)
        tol = tolerances(got[c.name].dtype)
        scale = sum(float(np.sum(np.abs(seeds[y]) * np.abs(jt[y]))) for y in out_names) + abs(lhs)
        assert abs(lhs - rhs) <= tol["atol"] * max(1.0, scale) + tol["rtol"] * abs(rhs), (
            x,
            lhs,
            rhs,
        )
    return vm


def check_adjoint(
    model: ir.Model,
    feeds: Feeds,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    seed: int = 2,
    built: tuple[ir.Model, ir.Model] | None = None,
) -> None:
    """<u, J v> from jvp(model) equals <Jᵀ u, v> from vjp(model).

    ``built`` is an already built pair ``(jvp(model, ...), vjp(model, ...))`` to check instead.
    """
    rng = np.random.default_rng(seed)
    if outputs is None:  # the same outputs for both (jvp's default differs on derivative models)
        outputs = jvp_default_outputs(model)
    jm, vm = built or (onnax.jvp(model, inputs, outputs), onnax.vjp(model, inputs, outputs))
    g = model.graph
    n_in, n_out = len(g.inputs), len(g.outputs)
    inits = _initializer_arrays(model)
    in_names, out_names = selected_names(model, inputs, outputs)
    primal = run(model, feeds)
    jfeeds, vfeeds = dict(feeds), dict(feeds)
    vs, us = {}, {}
    for x, t in zip(in_names, list(jm.graph.inputs)[n_in:], strict=True):
        ref = feeds[x] if x in feeds else inits[x]
        vs[x] = np.asarray(rng.standard_normal(ref.shape)).astype(ref.dtype)
        jfeeds[t.name] = vs[x]
    for y, s in zip(out_names, list(vm.graph.inputs)[n_in:], strict=True):
        us[y] = np.asarray(rng.standard_normal(primal[y].shape)).astype(primal[y].dtype)
        vfeeds[s.name] = us[y]
    jv = run(jm, jfeeds)
    vu = run(vm, vfeeds)
    lhs = sum(
        float(np.sum(us[y].astype(np.float64) * jv[t.name]))
        for y, t in zip(out_names, list(jm.graph.outputs)[n_out:], strict=True)
    )
    rhs = sum(
        float(np.sum(vs[x].astype(np.float64) * vu[c.name]))
        for x, c in zip(in_names, list(vm.graph.outputs)[n_out:], strict=True)
    )
    dtype = next(iter(vs.values())).dtype if vs else np.float64
    rtol = 1e-9 if dtype == np.float64 else 1e-4
    assert abs(lhs - rhs) <= rtol * max(1.0, abs(lhs), abs(rhs)), (lhs, rhs)


def check_vmap(
    model: ir.Model,
    feeds: Feeds,
    in_axes: object = 0,
    out_axes: object = 0,
    batch: int = 3,
    seed: int = 3,
    axis_size: int | None = None,
    transformed: ir.Model | None = None,
) -> ir.Model:
    """vmap(model) against a loop of single-example runs, stacked.

    ``feeds`` holds one example's inputs; batched inputs get ``batch`` random examples stacked
    at their axis (the first example is ``feeds`` itself, the others are perturbed copies).
    ``transformed`` is an already built ``vmap(model, in_axes, out_axes, axis_size)`` to check.
    """
    rng = np.random.default_rng(seed)
    vm = transformed
    if vm is None:
        vm = contract_checked(
            lambda m: onnax.vmap(m, in_axes=in_axes, out_axes=out_axes, axis_size=axis_size),
            model,
        )
    check_model_valid(vm)
    g = model.graph
    inputs = [v for v in g.inputs]
    if isinstance(in_axes, dict):
        axes = [in_axes.get(v.name) for v in inputs]
    elif isinstance(in_axes, (list, tuple)):
        axes = list(in_axes)
    else:
        axes = [in_axes] * len(inputs)
    axes = [None if v.name in g.initializers else a for v, a in zip(inputs, axes, strict=True)]
    examples: list[dict[str, np.ndarray]] = []
    for b in range(batch):
        ex = {}
        for v in inputs:
            if v.name not in feeds:
                continue
            base = np.asarray(feeds[v.name])
            a = axes[inputs.index(v)]
            if a is None or b == 0:
                ex[v.name] = base
            elif np.issubdtype(base.dtype, np.floating):
                ex[v.name] = np.asarray(base + rng.standard_normal(base.shape) * 0.1).astype(
                    base.dtype
                )
            else:
                ex[v.name] = base
        examples.append(ex)
    batched_feeds = {}
    for v, a in zip(inputs, axes, strict=True):
        if v.name not in feeds:
            continue
        if a is None:
            batched_feeds[v.name] = np.asarray(feeds[v.name])
        else:
            batched_feeds[v.name] = np.stack([ex[v.name] for ex in examples], axis=a)
    singles = [run(model, ex) for ex in examples]
    got = run(vm, batched_feeds)
    outs = [v.name for v in g.outputs]
    if isinstance(out_axes, dict):
        oaxes = [out_axes.get(n) for n in outs]
    elif isinstance(out_axes, (list, tuple)):
        oaxes = list(out_axes)
    else:
        oaxes = [out_axes] * len(outs)
    for name, a in zip(outs, oaxes, strict=True):
        want = np.stack([s[name] for s in singles], axis=a) if a is not None else singles[0][name]
        assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
        if np.issubdtype(want.dtype, np.floating):
            tol = 1e-10 if want.dtype == np.float64 else 1e-5
            np.testing.assert_allclose(got[name], want, rtol=tol, atol=tol, err_msg=f"vmap {name}")
        else:
            np.testing.assert_array_equal(got[name], want, err_msg=f"vmap {name}")
    return vm


def check_grad(
    model: ir.Model,
    feeds: Feeds,
    inputs: Sequence[str] | None = None,
    output: str | None = None,
    seed: int = 4,
    transformed: ir.Model | None = None,
) -> ir.Model:
    """grad(model) against central differences: <grad_x, d> = d loss / d eps along d, per input.

    ``transformed`` is an already built ``grad(model, inputs, output)`` to check instead.
    """
    rng = np.random.default_rng(seed)
    gm = transformed if transformed is not None else onnax.grad(model, inputs, output)
    check_model_valid(gm)
    g = model.graph
    in_names, out_names = selected_names(model, inputs, [output] if output else None)
    (loss,) = out_names
    got = run(gm, feeds)
    primal = run(model, feeds)
    for y in primal:
        np.testing.assert_allclose(got[y], primal[y], rtol=1e-6, atol=1e-6)
    inits = _initializer_arrays(model)
    for x, gx in zip(in_names, list(gm.graph.outputs)[len(g.outputs) :], strict=True):
        ref = feeds[x] if x in feeds else inits[x]
        assert got[gx.name].shape == ref.shape, (gx.name, got[gx.name].shape, ref.shape)
        direction = np.asarray(rng.standard_normal(ref.shape)).astype(ref.dtype)
        fd = fd_jvp(model, feeds, {x: direction}, [loss])[loss]
        lhs = float(np.sum(got[gx.name].astype(np.float64) * direction))
        tol = tolerances(got[gx.name].dtype)
        scale = float(np.sum(np.abs(got[gx.name].astype(np.float64) * direction)))
        assert abs(lhs - float(fd)) <= tol["atol"] * max(1.0, scale) + tol["rtol"] * abs(
            float(fd)
        ), (x, lhs, float(fd))
    return gm
