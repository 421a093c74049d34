"""Families for CasADi's ONNX backend, loaded and differentiated by the real CasADi.

Every derivative CasADi computes from a family (``f.reverse``, ``f.forward``, ``casadi.jacobian``
and ``casadi.hessian``) is compared with float64 central finite differences of the primal model
run in onnxruntime. The contract tests break one rule at a time and expect a clear error, never
a file that CasADi would misread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnax
from onnax.casadi import (
    CasadiContractError,
    build_family,
    casadi_diff_mask,
    check_family,
    family,
    onnxruntime_library,
    use_onnxruntime,
)

ca = pytest.importorskip(
    "casadi",
    reason="casadi is not installed; the CasADi tests need the extra: uv sync --extra casadi",
)
use_onnxruntime()

F32, F64 = ir.DataType.FLOAT, ir.DataType.DOUBLE
DTYPES = [pytest.param(F32, id="float32"), pytest.param(F64, id="float64")]
ALL = ("adj", "fwd_adj", "fwd")
RNG = np.random.default_rng(1234)
WEIGHTS = {
    "A": RNG.standard_normal((2, 4)) * 0.7,
    "W": RNG.standard_normal((3, 4)) * 0.6,
    "b": RNG.standard_normal(3) * 0.3,
    "K": RNG.standard_normal((2, 1, 3, 3)) * 0.4,
    "B": RNG.standard_normal((3, 2)) * 0.5,
}


# ------------------------------------------------------------------------------------ models
def _model(
    build: Callable[[ir.tape.Tape, list[ir.Value], ir.DataType], list[ir.Value]],
    inputs: dict[str, list[int | str]],
    dtype: ir.DataType,
    opset: int = 18,
) -> ir.Model:
    xs = [ir.val(n, dtype, s) for n, s in inputs.items()]
    tape = ir.tape.Tape()
    outs = build(tape, xs, dtype)
    graph = ir.Graph(
        xs,
        outs,
        nodes=tape.nodes,
        initializers=tape.initializers,
        opset_imports={"": opset},
        name="f",
    )
    return ir.Model(graph, ir_version=10)


def _weight(tape: ir.tape.Tape, name: str, dtype: ir.DataType) -> ir.Value:
    return tape.initializer(ir.tensor(WEIGHTS[name].astype(dtype.numpy()), name=name))


def _named(value: ir.Value, name: str) -> ir.Value:
    value.name = name
    return value


def vector_model(dtype: ir.DataType) -> ir.Model:
    """y = tanh(W x + b), x of shape [4]."""

    def build(t: ir.tape.Tape, xs: list[ir.Value], dt: ir.DataType) -> list[ir.Value]:
        h = t.op("Add", [t.op("MatMul", [_weight(t, "W", dt), xs[0]]), _weight(t, "b", dt)])
        return [_named(t.op("Tanh", [h]), "y")]

    return _model(build, {"x": [4]}, dtype)


def matrix_model(dtype: ir.DataType, batch: int | str = 3) -> ir.Model:
    """y = sin(x) A + x*x (elementwise, broadcast), x of shape [batch, 2]."""

    def build(t: ir.tape.Tape, xs: list[ir.Value], dt: ir.DataType) -> list[ir.Value]:
        x = xs[0]
        h = t.op("MatMul", [t.op("Sin", [x]), _weight(t, "A", dt)])
        sq = t.op(
            "ReduceSum", [t.op("Mul", [x, x]), t.initializer(ir.tensor(np.array([1]), name="axes"))]
        )
        return [_named(t.op("Add", [h, sq]), "y")]

    return _model(build, {"x": [batch, 2]}, dtype)


def rank3_model(dtype: ir.DataType) -> ir.Model:
    """y[i, k] = sum_j x[i, j, k]² sin(x[i, j, k]), x of shape [2, 2, 3]."""

    def build(t: ir.tape.Tape, xs: list[ir.Value], dt: ir.DataType) -> list[ir.Value]:
        x = xs[0]
        e = t.op("Mul", [t.op("Mul", [x, x]), t.op("Sin", [x])])
        axes = t.initializer(ir.tensor(np.array([1]), name="axes"))
        return [_named(t.op("ReduceSum", [e, axes], {"keepdims": 0}), "y")]

    return _model(build, {"x": [2, 2, 3]}, dtype)


def two_output_model(dtype: ir.DataType) -> ir.Model:
    """y = sin(x)*sum(p) of shape [3], and a scalar s = x*x + p*p."""

    def build(t: ir.tape.Tape, xs: list[ir.Value], dt: ir.DataType) -> list[ir.Value]:
        x, p = xs
        total = t.op("ReduceSum", [p], {"keepdims": 1})
        y = t.op("Mul", [t.op("Sin", [x]), total])
        s = t.op(
            "Add",
            [
                t.op("ReduceSum", [t.op("Mul", [x, x])], {"keepdims": 0}),
                t.op("ReduceSum", [t.op("Mul", [p, p])], {"keepdims": 0}),
            ],
        )
        return [_named(y, "y"), _named(s, "s")]

    return _model(build, {"x": [3], "p": [2]}, dtype)


def weight_model(dtype: ir.DataType) -> ir.Model:
    """y = tanh(x B), x [2, 3], B an initializer [3, 2] (selected as differentiable input)."""

    def build(t: ir.tape.Tape, xs: list[ir.Value], dt: ir.DataType) -> list[ir.Value]:
        return [_named(t.op("Tanh", [t.op("MatMul", [xs[0], _weight(t, "B", dt)])]), "y")]

    return _model(build, {"x": [2, 3]}, dtype)


def conv_model(dtype: ir.DataType) -> ir.Model:
    """y = tanh(conv(x, K)), x [1, 1, 4, 4], K [2, 1, 3, 3] (rank-4 input and output)."""

    def build(t: ir.tape.Tape, xs: list[ir.Value], dt: ir.DataType) -> list[ir.Value]:
        conv = t.op("Conv", [xs[0], _weight(t, "K", dt)], {"pads": [1, 1, 1, 1]})
        return [_named(t.op("Tanh", [conv]), "y")]

    return _model(build, {"x": [1, 1, 4, 4]}, dtype)


# ------------------------------------------------------------------------- the reference side
def _session(model: ir.Model) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in sess.get_inputs()]
    return lambda feeds: sess.run(None, {n: feeds[n] for n in names})


def _to_casadi(t: np.ndarray) -> np.ndarray:
    """A tensor as the matrix CasADi sees: rank 0/1 a column, rank 2 itself, else flattened."""
    if t.ndim <= 1:
        return t.reshape(-1, 1)
    if t.ndim == 2:
        return t
    return t.reshape(-1, 1)


def _vec(m: np.ndarray) -> np.ndarray:
    """CasADi's vectorisation: column by column."""
    return np.asarray(m).reshape(-1, order="F")


class Reference:
    """Float64 finite differences of a primal model, in CasADi's matrix conventions."""

    def __init__(
        self,
        model64: ir.Model,
        inputs: dict[str, np.ndarray],
        run: Callable[[dict[str, np.ndarray]], list[np.ndarray]] | None = None,
    ) -> None:
        self.run = run or _session(model64)
        self.x = inputs
        self.names = list(inputs)

    def f(self, x: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [_to_casadi(o) for o in self.run(x)]

    def jac(self, out: int, name: str, x: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """d vec(y_out) / d vec(x_name), both in CasADi's column-major order."""
        x = dict(x or self.x)
        base = _to_casadi(x[name])
        cols = []
        eps = 1e-6
        for j in range(base.size):
            e = np.zeros(base.size)
            e[j] = eps
            step = e.reshape(base.shape, order="F")
            shape = x[name].shape
            plus = dict(x, **{name: (base + step).reshape(shape)})
            minus = dict(x, **{name: (base - step).reshape(shape)})
            cols.append((_vec(self.f(plus)[out]) - _vec(self.f(minus)[out])) / (2 * eps))
        return np.stack(cols, axis=1)

    def hess(self, out: int, name: str, w: np.ndarray) -> np.ndarray:
        """The Hessian of dot(y_out, w) in x_name, by differences of differences."""
        base = _to_casadi(self.x[name])
        cols = []
        eps = 1e-4
        for j in range(base.size):
            e = np.zeros(base.size)
            e[j] = eps
            step = e.reshape(base.shape, order="F")
            shape = self.x[name].shape
            plus = dict(self.x, **{name: (base + step).reshape(shape)})
            minus = dict(self.x, **{name: (base - step).reshape(shape)})
            g_plus = _vec(w) @ self.jac(out, name, plus)
            g_minus = _vec(w) @ self.jac(out, name, minus)
            cols.append((g_plus - g_minus) / (2 * eps))
        return np.stack(cols, axis=1)


def _close(
    got: object, want: np.ndarray, dtype: ir.DataType, what: str, hess: bool = False
) -> None:
    got = np.asarray(ca.DM(got).full() if not isinstance(got, np.ndarray) else got)
    want = np.asarray(want)
    scale = max(1.0, float(np.max(np.abs(want))))
    tol = (2e-4 if dtype == F32 else 1e-7) if not hess else (5e-4 if dtype == F32 else 1e-5)
    err = float(np.max(np.abs(got.reshape(want.shape) - want)))
    assert err <= tol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g}, tol {tol:g})"


def _inputs(model: ir.Model, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    feeds = {}
    for v in model.graph.inputs:
        shape = [d if isinstance(d, int) else (dims or {})[str(d)] for d in v.shape.dims]
        feeds[str(v.name)] = rng.uniform(-1.0, 1.0, shape)
    return feeds


# --------------------------------------------------------------------- running it in CasADi
def _check_in_casadi(
    path: Path,
    make: Callable[[ir.DataType], ir.Model],
    dtype: ir.DataType,
    diff: list[str],
    values: dict[str, np.ndarray] | None = None,
    dims: dict[str, int] | None = None,
    forward: bool = True,
    bind: dict[str, int] | None = None,
    reference: Callable[[dict[str, np.ndarray]], list[np.ndarray]] | None = None,
) -> None:
    """f(x), f.reverse(1), f.reverse(3), f.forward(1), jacobian and hessian against FD."""
    model64 = make(F64)
    if dims:
        model64 = _bound(model64, dims)
    x = _inputs(model64, dims)
    for name, value in (values or {}).items():
        x[name] = value.astype(np.float64)
        promoted = model64.graph.initializers.pop(name)
        promoted.const_value = None
        model64.graph.inputs.append(promoted)
    ref = Reference(model64, x, reference)
    builder = ca.GraphBuilder(str(path))
    for name, size in (bind or {}).items():
        builder.bind_dim(name, size)
    f = builder.create("f")
    names = [f.name_in(i) for i in range(f.n_in())]
    assert sorted(names) == sorted(x), (names, list(x))
    args = [_to_casadi(x[n]) for n in names]
    outs = ref.f(x)
    got = f(*args)
    got = got if isinstance(got, tuple) else (got,)
    for k, (g, w) in enumerate(zip(got, outs, strict=True)):
        _close(g, w, dtype, f"f output {k}")
    jacs = {(k, n): ref.jac(k, n) for k in range(len(outs)) for n in diff}
    # reverse(1) and reverse(3): seeds are rx(n*c) seed-major column blocks.
    for nseed in (1, 3):
        rev = f.reverse(nseed)
        seeds = [RNG.standard_normal((o.shape[0], nseed * o.shape[1])) for o in outs]
        res = rev(*args, *outs, *seeds)
        res = res if isinstance(res, tuple) else (res,)
        for i, n in enumerate(names):
            if n not in diff:
                continue
            shape = args[i].shape
            for s in range(nseed):
                want = sum(
                    jacs[k, n].T @ _vec(seeds[k][:, s * o.shape[1] : (s + 1) * o.shape[1]])
                    for k, o in enumerate(outs)
                )
                block = np.asarray(ca.DM(res[i]).full())[:, s * shape[1] : (s + 1) * shape[1]]
                _close(_vec(block), want, dtype, f"reverse({nseed}) adj_{n} seed {s}")
    if forward:
        fwd = f.forward(1)
        seeds = [RNG.standard_normal(a.shape) for a in args]
        res = fwd(*args, *outs, *seeds)
        res = res if isinstance(res, tuple) else (res,)
        for k in range(len(outs)):
            want = sum(jacs[k, n] @ _vec(seeds[i]) for i, n in enumerate(names) if n in diff)
            _close(_vec(np.asarray(ca.DM(res[k]).full())), want, dtype, f"forward(1) output {k}")
    syms = [ca.MX.sym(n, *a.shape) for n, a in zip(names, args, strict=True)]
    ys = f(*syms)
    ys = ys if isinstance(ys, tuple) else (ys,)
    for k in range(len(outs)):
        for i, n in enumerate(names):
            if n not in diff:
                continue
            jac = ca.Function("J", syms, [ca.jacobian(ys[k], syms[i])])(*args)
            _close(jac, jacs[k, n], dtype, f"jacobian(y{k}, {n})")
    # The exact Hessian of a weighted sum of the first output, in the first input.
    n0 = diff[0]
    i0 = names.index(n0)
    w = RNG.standard_normal(outs[0].shape)
    hess = ca.Function("H", syms, [ca.hessian(ca.dot(ys[0], w), syms[i0])[0]])(*args)
    _close(hess, ref.hess(0, n0, w), dtype, f"hessian in {n0}", hess=True)


def _bound(model: ir.Model, dims: dict[str, int]) -> ir.Model:
    for v in model.graph.inputs:
        v.shape = ir.Shape(
            [dims.get(str(d), d) if not isinstance(d, int) else d for d in v.shape.dims]
        )
    for node in model.graph:
        for o in node.outputs:
            o.shape = None
            o.type = None
    for o in model.graph.outputs:
        o.shape = None
        o.type = None
    return model


MODELS = {
    "vector": (vector_model, ["x"]),
    "matrix": (matrix_model, ["x"]),
    "rank3": (rank3_model, ["x"]),
    "two_outputs": (two_output_model, ["x", "p"]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(MODELS))
def test_family_in_casadi(tmp_path: Path, name: str, dtype: ir.DataType) -> None:
    make, diff = MODELS[name]
    fam = family(make(dtype), tmp_path / "f.onnx", kinds=ALL)
    assert list(fam.inputs) == diff
    for path in fam.files.values():
        assert onnx.load(str(path)).graph.input[0].type.tensor_type.elem_type == dtype.value
    _check_in_casadi(fam.path, make, dtype, diff)


@pytest.mark.parametrize("dtype", DTYPES)
def test_initializer_as_differentiable_input(tmp_path: Path, dtype: ir.DataType) -> None:
    fam = family(weight_model(dtype), tmp_path / "f.onnx", inputs=["x", "B"], kinds=ALL)
    assert fam.inputs == ("x", "B")
    np.testing.assert_array_equal(fam.values["B"], WEIGHTS["B"].astype(dtype.numpy()))
    for path in fam.files.values():
        assert not onnx.load(str(path)).graph.initializer or all(
            t.name != "B" for t in onnx.load(str(path)).graph.initializer
        )
    _check_in_casadi(fam.path, weight_model, dtype, ["x", "B"], values=fam.values)


def _conv_reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """conv_model in float64 numpy: onnxruntime has no double Conv kernel."""
    x = np.pad(feeds["x"], ((0, 0), (0, 0), (1, 1), (1, 1)))
    k = WEIGHTS["K"]
    y = np.zeros((1, 2, 4, 4))
    for i in range(4):
        for j in range(4):
            y[0, :, i, j] = np.einsum("ckl,ockl->o", x[0, :, i : i + 3, j : j + 3], k)
    return [np.tanh(y)]


def test_conv_net(tmp_path: Path) -> None:
    # float32 only: onnxruntime has no double Conv kernel, so CasADi cannot run a double family.
    fam = family(conv_model(F32), tmp_path / "f.onnx", kinds=ALL)
    _check_in_casadi(fam.path, conv_model, F32, ["x"], reference=_conv_reference)


@pytest.mark.parametrize("dtype", DTYPES)
def test_symbolic_batch_bound(tmp_path: Path, dtype: ir.DataType) -> None:
    fam = family(matrix_model(dtype, "N"), tmp_path / "f.onnx", kinds=ALL, dims={"N": 4})
    assert fam.dims == {"N": 4}
    assert ir.load(fam.path).graph.inputs[0].shape.dims == (4, 2)
    _check_in_casadi(fam.path, lambda dt: matrix_model(dt, "N"), dtype, ["x"], dims={"N": 4})


def test_symbolic_batch_kept(tmp_path: Path) -> None:
    fam = family(matrix_model(F64, "N"), tmp_path / "f.onnx", kinds=ALL, dims={"N": None})
    adj = ir.load(fam.files["adj"])
    assert [str(d) for d in adj.graph.inputs[1].shape.dims] == ["N", "4*nadj"]
    _check_in_casadi(
        fam.path,
        lambda dt: matrix_model(dt, "N"),
        F64,
        ["x"],
        dims={"N": 5},
        bind={"N": 5},
    )


def test_symbolic_batch_needs_a_choice() -> None:
    with pytest.raises(
        CasadiContractError,
        match=r"symbolic dimensions \['N'\].*dims=\{'N': 4\}.*dims=\{'N': None\}",
    ):
        build_family(matrix_model(F64, "N"))
    with pytest.raises(CasadiContractError, match="not symbolic dimensions"):
        build_family(matrix_model(F64, "N"), dims={"M": 3, "N": 3})


@pytest.mark.parametrize("kinds", [("adj", "adj_adj"), ("fwd", "fwd_fwd"), ("jac",)])
def test_other_kinds(tmp_path: Path, kinds: tuple[str, ...]) -> None:
    fam = family(two_output_model(F64), tmp_path / "f.onnx", kinds=kinds)
    model64 = two_output_model(F64)
    x = _inputs(model64)
    ref = Reference(model64, x)
    f = ca.GraphBuilder(str(fam.path)).create("f")
    syms = [ca.MX.sym("x", 3, 1), ca.MX.sym("p", 2, 1)]
    y, s = f(*syms)
    args = [x["x"], x["p"]]
    for k, out in enumerate((y, s)):
        for i, n in enumerate(("x", "p")):
            jac = ca.Function("J", syms, [ca.jacobian(out, syms[i])])(*args)
            _close(jac, ref.jac(k, n), F64, f"{kinds}: jacobian(y{k}, {n})")
    if kinds != ("jac",):
        w = RNG.standard_normal((3, 1))
        hess = ca.Function("H", syms, [ca.hessian(ca.dot(y, w), syms[0])[0]])(*args)
        _close(hess, ref.hess(0, "x", w), F64, f"{kinds}: hessian", hess=True)


def test_jac_layout_is_column_major() -> None:
    models = build_family(matrix_model(F64), kinds=("jac",))
    jac = models["jac"].graph.outputs[1]
    assert jac.name == "jac_y_x"
    assert jac.shape.dims == (12, 6)


def test_layout_onnx_has_trailing_seed_axes() -> None:
    models = build_family(rank3_model(F64), layout="onnx", kinds=("adj", "fwd_adj"))
    adj = {v.name: [str(d) for d in v.shape.dims] for v in models["adj"].graph.inputs}
    assert adj["adj_y"] == ["2", "3", "nadj"]
    fwd_adj = {v.name: [str(d) for d in v.shape.dims] for v in models["fwd_adj"].graph.inputs}
    assert fwd_adj["fwd_x"] == ["2", "2", "3", "nfwd"]
    assert fwd_adj["fwd_adj_y"] == ["2", "3", "nadj", "nfwd"]
    # Seed s of the adjoint is slice [..., s] and agrees with vjp.
    model = rank3_model(F64)
    x = _inputs(model)
    seeds = RNG.standard_normal((2, 3, 2))
    (_, adj_x) = _session(models["adj"])({"x": x["x"], "adj_y": seeds})
    pullback = _session(onnax.vjp(model))
    for s in range(2):
        (_, want) = pullback({"x": x["x"], "adj_y": seeds[..., s]})
        np.testing.assert_allclose(adj_x[..., s], want, rtol=1e-12, atol=1e-12)


def test_casadi_layout_in_onnxruntime() -> None:
    """The rx(n*c) layout, checked in onnxruntime alone: seed s is column block s."""
    models = build_family(matrix_model(F64), kinds=("adj", "fwd_adj"))
    model = matrix_model(F64)
    x = _inputs(model)["x"]
    seeds = RNG.standard_normal((3, 4 * 3))
    (_, adj_x) = _session(models["adj"])({"x": x, "adj_y": seeds})
    assert adj_x.shape == (3, 2 * 3)
    pullback = _session(onnax.vjp(model))
    for s in range(3):
        (_, want) = pullback({"x": x, "adj_y": seeds[:, 4 * s : 4 * (s + 1)]})
        np.testing.assert_allclose(adj_x[:, 2 * s : 2 * (s + 1)], want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------ the contract points
def test_sibling_files_and_names(tmp_path: Path) -> None:
    fam = family(
        two_output_model(F64),
        tmp_path / "m.onnx",
        kinds=("adj", "fwd_adj", "fwd", "fwd_fwd", "adj_adj", "jac"),
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            "m.onnx",
            "adj_m.onnx",
            "fwd_adj_m.onnx",
            "fwd_m.onnx",
            "fwd_fwd_m.onnx",
            "adj_adj_m.onnx",
            "jac_m.onnx",
        ]
    )
    adj = ir.load(fam.files["adj"]).graph
    assert [v.name for v in adj.inputs] == ["x", "p", "adj_y", "adj_s"]
    assert [v.name for v in adj.outputs] == ["y", "s", "adj_x", "adj_p"]
    fwd_adj = ir.load(fam.files["fwd_adj"]).graph
    assert [v.name for v in fwd_adj.inputs] == [
        "x",
        "p",
        "adj_y",
        "adj_s",
        "fwd_x",
        "fwd_p",
        "fwd_adj_y",
        "fwd_adj_s",
    ]
    assert [v.name for v in fwd_adj.outputs][-2:] == ["fwd_adj_x", "fwd_adj_p"]
    adj_adj = ir.load(fam.files["adj_adj"]).graph
    assert [v.name for v in adj_adj.inputs][-2:] == ["adj2_adj_x", "adj2_adj_p"]
    fwd_fwd = ir.load(fam.files["fwd_fwd"]).graph
    assert [str(d) for d in fwd_fwd.inputs[-1].shape.dims] == ["2", "nfwd*nfwd2"]
    jac = ir.load(fam.files["jac"]).graph
    assert [v.name for v in jac.outputs] == ["y", "s", "jac_y_x", "jac_y_p", "jac_s_x", "jac_s_p"]
    assert check_family(fam.path) == ["f", "adj", "fwd", "jac", "adj_adj", "fwd_adj", "fwd_fwd"]


def test_stale_siblings_are_removed(tmp_path: Path) -> None:
    family(vector_model(F64), tmp_path / "f.onnx", kinds=("adj", "fwd_adj", "fwd"))
    family(vector_model(F64), tmp_path / "f.onnx", kinds=("adj",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adj_f.onnx", "f.onnx"]


def test_kinds_are_checked() -> None:
    with pytest.raises(CasadiContractError, match="unknown kind 'hess'"):
        build_family(vector_model(F64), kinds=("hess",))
    with pytest.raises(CasadiContractError, match="'fwd_adj' needs 'adj'"):
        build_family(vector_model(F64), kinds=("fwd_adj",))


def test_existing_derivative_names_get_the_next_prefix(tmp_path: Path) -> None:
    model = onnax.jvp(vector_model(F64))
    assert casadi_diff_mask(model.graph) == {"x": True, "fwd_x": False}
    fam = family(model, tmp_path / "f.onnx", kinds=("adj", "fwd_adj", "fwd"))
    assert fam.inputs == ("x",) and fam.parameters == ("fwd_x",)
    fwd = ir.load(fam.files["fwd"]).graph
    assert [v.name for v in fwd.inputs] == ["x", "fwd_x", "fwd2_x"]
    assert [str(d) for d in fwd.inputs[2].shape.dims] == ["4", "nfwd2"]
    f = ca.GraphBuilder(str(fam.path)).create("f")
    assert f.is_diff_in() == [True, False]
    x0, t0 = _inputs(model)["x"], RNG.standard_normal(4)
    xs, ts = ca.MX.sym("x", 4), ca.MX.sym("t", 4)
    _, fy = f(xs, ts)
    jac = ca.Function("J", [xs, ts], [ca.jacobian(fy, xs)])(x0, t0)
    ref = Reference(model, {"x": x0, "fwd_x": t0})
    _close(jac, ref.jac(1, "x"), F64, "jacobian of a tangent")
    with pytest.raises(CasadiContractError, match="signatures disagree"):
        build_family(model, inputs=["x", "fwd_x"])


def test_out_names_are_reserved() -> None:
    def build(t: ir.tape.Tape, xs: list[ir.Value], dt: ir.DataType) -> list[ir.Value]:
        return [_named(t.op("Mul", xs), "y")]

    model = _model(build, {"x": [2], "out_y": [2]}, F64)
    with pytest.raises(
        CasadiContractError, match="'out_y' has the name CasADi uses to feed the primal output"
    ):
        build_family(model)


def test_adj_needs_every_float_output() -> None:
    with pytest.raises(
        CasadiContractError,
        match=r"leaves out the FLOAT/DOUBLE outputs \['s'\].*incomplete adj signature",
    ):
        build_family(two_output_model(F64), outputs=["y"])


def _rewrite(path: Path, change: Callable[[ir.Graph], None]) -> None:
    model = ir.load(path)
    change(model.graph)
    ir.save(model, path)


def _value(values: object, name: str) -> ir.Value:
    return next(v for v in values if v.name == name)  # type: ignore[attr-defined]


def test_missing_seed_is_an_error(tmp_path: Path) -> None:
    fam = family(two_output_model(F64), tmp_path / "f.onnx")

    def drop(g: ir.Graph) -> None:
        seed = _value(g.inputs, "adj_s")
        zero = ir.node("Constant", [], attributes={"value": ir.tensor(np.zeros((1, 1)))})
        g.insert_before(g[0], zero)
        seed.replace_all_uses_with(zero.outputs[0])
        g.inputs.remove(seed)

    _rewrite(fam.files["adj"], drop)
    with pytest.raises(
        CasadiContractError,
        match=r"adj_f\.onnx: the seed input 'adj_s' is missing.*incomplete adj signature",
    ):
        check_family(fam.path)
    # ... which CasADi refuses too.
    with pytest.raises(RuntimeError, match="incomplete adj signature"):
        ca.GraphBuilder(str(fam.path)).create("f").reverse(1)


def test_renamed_adjoint_output_is_an_error(tmp_path: Path) -> None:
    fam = family(two_output_model(F64), tmp_path / "f.onnx")
    _rewrite(fam.files["adj"], lambda g: setattr(_value(g.outputs, "adj_p"), "name", "adj_pp"))
    with pytest.raises(
        CasadiContractError, match=r"output 'adj_p' is missing.*silently use a zero derivative"
    ):
        check_family(fam.path)
    # The trap is real: CasADi now takes p as non-differentiable, without an error.
    f = ca.GraphBuilder(str(fam.path)).create("f")
    assert f.is_diff_in() == [True, False]


def test_missing_primal_input_is_an_error(tmp_path: Path) -> None:
    fam = family(two_output_model(F64), tmp_path / "f.onnx", kinds=("adj",))

    def drop(g: ir.Graph) -> None:
        p = _value(g.inputs, "p")
        ones = ir.node("Constant", [], attributes={"value": ir.tensor(np.ones(2))})
        g.insert_before(g[0], ones)
        p.replace_all_uses_with(ones.outputs[0])
        g.inputs.remove(p)

    _rewrite(fam.files["adj"], drop)
    with pytest.raises(CasadiContractError, match="input 'p' of its parent is missing"):
        check_family(fam.path)


def test_unknown_input_is_an_error(tmp_path: Path) -> None:
    fam = family(vector_model(F64), tmp_path / "f.onnx", kinds=("adj",))

    def extra(g: ir.Graph) -> None:
        bias = ir.val("bias", F64, [4, "nadj"])
        g.inputs.append(bias)
        old = _value(g.outputs, "adj_x")
        node = ir.node("Add", [old, bias])
        g.append(node)
        new = node.outputs[0]
        old.name, new.name = "adj_x_old", "adj_x"
        new.type, new.shape = old.type, old.shape
        g.outputs[list(g.outputs).index(old)] = new

    _rewrite(fam.files["adj"], extra)
    with pytest.raises(CasadiContractError, match=r"inputs \['bias'\].*NaN"):
        check_family(fam.path)
    # The trap is real: CasADi fills the unknown input with NaN.
    f = ca.GraphBuilder(str(fam.path)).create("f")
    out = f.reverse(1)(np.zeros(4), np.zeros(3), np.ones(3))
    assert np.isnan(np.asarray(ca.DM(out).full())).all()


def test_fwd_adj_needs_the_seed_of_the_adjoint_seed(tmp_path: Path) -> None:
    fam = family(vector_model(F64), tmp_path / "f.onnx")

    def drop(g: ir.Graph) -> None:
        seed = _value(g.inputs, "fwd_adj_y")
        zero = ir.node(
            "Mul",
            [
                _value(g.inputs, "adj_y"),
                ir.node("Constant", [], attributes={"value": ir.tensor(np.array(0.0))}).outputs[0],
            ],
        )
        g.insert_before(g[0], [zero.inputs[1].producer(), zero])
        seed.replace_all_uses_with(zero.outputs[0])
        g.inputs.remove(seed)

    _rewrite(fam.files["fwd_adj"], drop)
    with pytest.raises(
        CasadiContractError, match=r"fwd_adj_f\.onnx: the seed input 'fwd_adj_y' is missing"
    ):
        check_family(fam.path)


def test_fixed_seed_sizes_are_an_error(tmp_path: Path) -> None:
    fam = family(vector_model(F64), tmp_path / "f.onnx", kinds=("adj",))

    def fix(g: ir.Graph) -> None:
        _value(g.inputs, "adj_y").shape = ir.Shape([3, 1])
        _value(g.outputs, "adj_x").shape = ir.Shape([4, 1])

    _rewrite(fam.files["adj"], fix)
    with pytest.raises(
        CasadiContractError,
        match=r"'adj_y' has shape \[3, 1\], expected \[3, 'nadj'\].*named symbolic dimension 'nadj'",
    ):
        check_family(fam.path)
    # CasADi accepts one seed and refuses more.
    f = ca.GraphBuilder(str(fam.path)).create("f")
    f.reverse(1)
    with pytest.raises(RuntimeError, match="incompatible shape"):
        f.reverse(3)


def test_wrong_seed_name_dimension_is_an_error(tmp_path: Path) -> None:
    fam = family(vector_model(F64), tmp_path / "f.onnx", kinds=("adj",))

    def rename(g: ir.Graph) -> None:
        _value(g.inputs, "adj_y").shape = ir.Shape([3, "n"])
        _value(g.outputs, "adj_x").shape = ir.Shape([4, "n"])

    _rewrite(fam.files["adj"], rename)
    with pytest.raises(CasadiContractError, match="'nadj'"):
        check_family(fam.path)


def test_seed_dtype_must_match(tmp_path: Path) -> None:
    fam = family(vector_model(F32), tmp_path / "f.onnx", kinds=("adj",))
    _rewrite(fam.files["adj"], lambda g: setattr(_value(g.inputs, "adj_y"), "dtype", F64))
    with pytest.raises(CasadiContractError, match="element type DOUBLE, expected FLOAT"):
        check_family(fam.path)


def test_external_data_is_an_error_and_family_embeds(tmp_path: Path) -> None:
    fam = family(vector_model(F64), tmp_path / "f.onnx", kinds=("adj",))
    proto = onnx.load(str(fam.path))
    onnx.save(
        proto, str(fam.path), save_as_external_data=True, location="f.onnx.data", size_threshold=0
    )
    with pytest.raises(
        CasadiContractError, match=r"'W' is stored as external data.*external_data=False"
    ):
        check_family(fam.path)
    with pytest.raises(RuntimeError, match="Failed to create ONNX Runtime session"):
        ca.GraphBuilder(str(fam.path)).create("f")
    # A model loaded with external data is written with its weights inside.
    source = ir.load(fam.path)
    out = family(source, tmp_path / "g" / "f.onnx", kinds=("adj",))
    assert sorted(p.name for p in out.path.parent.iterdir()) == ["adj_f.onnx", "f.onnx"]
    check_family(out.path)


def test_writes_are_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = family(vector_model(F64), tmp_path / "f.onnx", kinds=("adj",))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    calls = []
    real = onnx.save_model

    def failing(proto: onnx.ModelProto, path: str) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        real(proto, path)

    monkeypatch.setattr(onnx, "save_model", failing)
    with pytest.raises(OSError, match="disk full"):
        family(two_output_model(F64), first.path, kinds=("adj", "fwd_adj"))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    empty = tmp_path / "new"
    with pytest.raises(OSError, match="disk full"):
        calls.clear()
        family(two_output_model(F64), empty / "f.onnx", kinds=("adj", "fwd_adj"))
    assert list(empty.iterdir()) == []


def test_a_failing_export_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(CasadiContractError):
        family(two_output_model(F64), tmp_path / "f.onnx", outputs=["y"])
    assert list(tmp_path.iterdir()) == []


def test_onnxruntime_library() -> None:
    path = onnxruntime_library()
    assert Path(path).is_file() and "onnxruntime" in Path(path).name
    assert os.environ["CASADI_ONNXRUNTIME_LIB"]
