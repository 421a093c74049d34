"""Shapes as complete as the best engine available (core/shape_fill.py).

TorchScript exports compute the shapes of their masks at run time, in arithmetic that
onnx_shape_inference does not follow (``ConstantOfShape``, ``Equal``, a ``Where`` whose branches
differ); every value after such an ``Expand`` used to have no rank, and the reverse-mode and
batching rules that need one refused. These are minimal hand-written versions of what GPT-2,
BERT, Llama and T5 exports do, each checked against oracles that know nothing of the rules:
float64 central differences (``<grad, v>`` against the difference along ``v``, vjp through
``oracles.check_vjp``) and vmap against a loop of single runs (``oracles.check_vmap``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from onnax.core.inference import infer_shapes
from onnax.core.inferred import unchanged
from onnax.passes.prepare import prepare
from oracles import check_vjp, check_vmap, fd_jvp, run, tolerances

HEADER = '<ir_version: 10, opset_import: ["" : 17]>\n'

# GPT-2's attention mask: torch's expand(2, -1, 4) exports its -1 as Where(shape == -1, 1, shape)
# over constants; here it broadcasts a [2, 1, 4] mask against [2, 3, 4] scores.
TORCHSCRIPT_EXPAND = """
g (double[2, 1, 4] m, double[2, 3, 4] q, double[2, 4, 5] v) => (double[2, 3, 5] y, double l) {
    c = Constant <value = int64[3] {2, -1, 4}> ()
    n = Constant <value = int64[1] {3}> ()
    ones = ConstantOfShape <value = int64[1] {1}> (n)
    neg = Constant <value = int64 {-1}> ()
    minus = Mul (ones, neg)
    eq = Equal (c, minus)
    shape = Where (eq, ones, c)
    e = Expand (m, shape)
    a = Add (q, e)
    t = Tanh (a)
    y = MatMul (t, v)
    l = ReduceSum <keepdims = 0> (y)
}
"""

# The same -1 filled in from Shape/Gather/Concat of a static input (BERT's extended mask).
SHAPE_ARITHMETIC_EXPAND = """
g (double[1, 4] m, double[2, 3, 4] q, double[2, 4, 5] v) => (double[2, 3, 5] y, double l) {
    s = Shape (q)
    i0 = Constant <value = int64[1] {0}> ()
    b = Gather <axis = 0> (s, i0)
    rest = Constant <value = int64[2] {-1, 4}> ()
    c = Concat <axis = 0> (b, rest)
    n = Constant <value = int64[1] {3}> ()
    ones = ConstantOfShape <value = int64[1] {1}> (n)
    neg = Constant <value = int64 {-1}> ()
    minus = Mul (ones, neg)
    eq = Equal (c, minus)
    shape = Where (eq, ones, c)
    e = Expand (m, shape)
    a = Add (q, e)
    t = Tanh (a)
    y = MatMul (t, v)
    l = ReduceSum <keepdims = 0> (y)
}
"""

# A decoder's causal mask: ones of a computed [S, S] (S from the input's shape), then Trilu.
CAUSAL_MASK = """
g (double[2, 4, 3] x) => (double[2, 4, 3] y, double l) {
    s = Shape (x)
    i1 = Constant <value = int64[1] {1}> ()
    S = Gather <axis = 0> (s, i1)
    two = Constant <value = int64[1] {2}> ()
    SS = Expand (S, two)
    ones = ConstantOfShape <value = double[1] {1}> (SS)
    mask = Trilu <upper = 0> (ones)
    t = Tanh (x)
    y = MatMul (mask, t)
    l = ReduceSum <keepdims = 0> (y)
}
"""


def _model(text: str) -> ir.Model:
    return ir.from_onnx_text(HEADER + text)


def _feeds(model: ir.Model, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        str(v.name): rng.standard_normal([int(d) for d in v.shape.dims])
        for v in model.graph.inputs
        if v.dtype == ir.DataType.DOUBLE
    }


def _check_grad(model: ir.Model, feeds: Mapping[str, np.ndarray], inputs: Sequence[str]) -> None:
    """``<grad_x, v>`` against float64 central differences of ``l`` along ``v``."""
    gm = onnax.grad(model, list(inputs), output="l")
    got = run(gm, feeds)
    rng = np.random.default_rng(1)
    tol = tolerances(np.dtype(np.float64))
    for x in inputs:
        assert got[f"grad_{x}"].shape == feeds[x].shape
        v = rng.standard_normal(feeds[x].shape)
        fd = float(fd_jvp(model, feeds, {x: v}, ["l"])["l"])
        lhs = float(np.sum(got[f"grad_{x}"] * v))
        assert abs(lhs - fd) <= tol["atol"] + tol["rtol"] * abs(fd), (x, lhs, fd)


@pytest.mark.parametrize(
    "text", [TORCHSCRIPT_EXPAND, SHAPE_ARITHMETIC_EXPAND], ids=["constants", "shape"]
)
def test_expand_of_run_time_shape_arithmetic(text: str) -> None:
    model = _model(text)
    feeds = _feeds(model)
    prepared = prepare(model, "test")
    expanded = next(n for n in prepared.graph if n.op_type == "Expand").outputs[0]
    assert expanded.shape is not None
    assert list(expanded.shape.dims) == [2, 1, 4]
    inputs = list(feeds)
    check_vjp(model, feeds, inputs, ["y"])
    _check_grad(model, feeds, inputs)
    check_vmap(model, feeds, in_axes=0)
    check_vmap(onnax.grad(model, inputs, output="l"), feeds, in_axes=(0, None, None))


def test_causal_mask_of_a_computed_square_shape() -> None:
    model = _model(CAUSAL_MASK)
    feeds = _feeds(model)
    check_vjp(model, feeds, ["x"], ["y"])
    _check_grad(model, feeds, ["x"])
    check_vmap(model, feeds, in_axes=0)
    check_vmap(onnax.grad(model, ["x"], output="l"), feeds, in_axes=0)


# onnx_shape_inference gives this Expand no shape (its target is known at run time only), but
# its rank is 2: onnx.shape_inference says so, and the broadcasting Add's batch rule needs it.
# (y is declared [M, 3], a dimension the Expand may give to x's N: with N = 1, M is s[0].)
RUN_TIME_TARGET = """
g (double[N, 1] x, int64[2] s, double[3] b) => (double[M, 3] y) {
    e = Expand (x, s)
    t = Tanh (e)
    y = Add (t, b)
}
"""


def test_rank_from_onnx_shape_inference_without_its_guessed_dimensions() -> None:
    model = _model(RUN_TIME_TARGET)
    prepared = prepare(model, "test")
    expanded = prepared.graph.node(0).outputs[0]
    assert expanded.shape is not None and expanded.shape.rank() == 2
    # onnx calls the result [N, unk__0]; N is a guess (with N = 1 the result is s[0] long) and
    # unk__0 a placeholder, so neither is taken (onnx_shape_inference then finds M from y).
    names = [str(d) for d in expanded.shape.dims]
    assert "N" not in names and not any(name.startswith("unk__") for name in names), names
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 1)), "s": np.array([4, 3]), "b": rng.standard_normal(3)}
    check_vmap(model, feeds, in_axes=(0, None, None))
    check_vmap(model, feeds, in_axes=(None, None, 0))
    check_vjp(model, feeds, ["x", "b"])


def test_folding_keeps_to_shape_arithmetic() -> None:
    """Integer and boolean arithmetic is folded (onnx_shape_inference has no Equal of shape
    vectors); an inexact float function (Exp) and results larger than shape vectors are left
    for the runtime to compute."""
    model = _model("""
g (float[2, 3] x) => (float[2, 3] y) {
    s = Shape (x)
    k = Constant <value = int64[1] {2}> ()
    d = Mul (s, k)
    eq = Equal (d, k)
    c = Constant <value = float[1] {0.5}> ()
    e = Exp (c)
    sq = Constant <value = int64[2] {64, 64}> ()
    big = ConstantOfShape <value = float[1] {1}> (sq)
    u = Mul (x, e)
    y = Identity (u)
}
""")
    infer_shapes(model)
    values = {str(o.name): o for n in model.graph for o in n.outputs}
    assert values["d"].const_value is not None
    assert values["d"].const_value.numpy().tolist() == [4, 6]
    assert values["eq"].const_value is not None
    assert values["eq"].const_value.numpy().tolist() == [False, False]
    assert values["e"].const_value is None
    assert values["big"].const_value is None and list(values["big"].shape.dims) == [64, 64]


# grad reduces the cotangent of p over the axes where broadcasting against x made it larger,
# known at run time only (N and K may each be 1): ReduceSum(keepdims=1) with axes computed by
# NonZero(Shape(p) == 1). Neither engine gives that reduction a rank, and vmap of the grad,
# with p batched, has to align it with the batched (1 - tanh(p)^2) in the Mul that follows.
RUN_TIME_UNBROADCAST = """
g (double[N, 3] x, double[K, 3] p, double[N, 3] d) => (double l) {
    c = Tanh (p)
    xc = Mul (x, c)
    y = Mul (xc, d)
    l = ReduceSum <keepdims = 0> (y)
}
"""


def test_vmap_of_a_grad_that_reduces_over_run_time_axes() -> None:
    model = _model(RUN_TIME_UNBROADCAST)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 3)), "p": rng.standard_normal((1, 3))}
    feeds["d"] = rng.standard_normal((4, 3))
    _check_grad(model, feeds, ["p"])
    gm = onnax.grad(model, ["p"], output="l")
    for in_axes in ((None, 0, None), (0, 0, 0)):
        check_vmap(gm, feeds, in_axes=in_axes)


@pytest.mark.parametrize("transform", ["jvp", "vjp", "grad", "vmap", "vmap_of_grad"])
def test_every_emitted_value_has_a_type(transform: str) -> None:
    """...and a shape wherever inference knows one, here everywhere: the shapes are static."""
    model = _model(TORCHSCRIPT_EXPAND)
    inputs = ["m", "q", "v"]
    results = {
        "jvp": lambda: onnax.jvp(model, inputs, ["y"]),
        "vjp": lambda: onnax.vjp(model, inputs, ["y"]),
        "grad": lambda: onnax.grad(model, inputs, output="l"),
        "vmap": lambda: onnax.vmap(model, in_axes=0),
        "vmap_of_grad": lambda: onnax.vmap(onnax.grad(model, inputs, output="l"), in_axes=0),
    }
    result = results[transform]()
    values = [out for graph in result.graphs() for node in graph for out in node.outputs]
    assert [v.name for v in values if v.type is None] == []
    assert [v.name for v in values if v.shape is None] == []


# Indices of unknown rank (a Squeeze without axes of run-time dimensions: [2, 1, 2] here, but
# inference cannot know which dimensions are 1). Gather along axis 0 transposes to a ScatterND
# that needs no rank; duplicate and negative indices accumulate into the same rows.
GATHER_UNKNOWN_RANK = """
g (double[5, 3] w, int64[4] i, int64[3] s) => (double l) {
    r = Reshape (i, s)
    sq = Squeeze (r)
    e = Gather <axis = 0> (w, sq)
    t = Tanh (e)
    l = ReduceSum <keepdims = 0> (t)
}
"""


def test_gather_transpose_without_ranks() -> None:
    model = _model(GATHER_UNKNOWN_RANK)
    assert prepare(model, "test").graph.node(2).inputs[1].shape is None
    feeds = {
        "w": np.random.default_rng(0).standard_normal((5, 3)),
        "i": np.array([0, 4, 0, -2]),
        "s": np.array([2, 1, 2]),
    }
    _check_grad(model, feeds, ["w"])
    check_vjp(model, feeds, ["w"])


def test_shape_of_unknown_rank_keeps_an_unknown_length() -> None:
    """Shapes inferred on a vmapped Shape of unknown rank, then run. onnx says Shape's output
    is [unk]; taking it let onnx_shape_inference's Slice of that vector to a huge end (vmap's
    Shape(x)[1:]) "infer" the huge length as a static shape, which onnxruntime then believed
    (an invalid Expand)."""
    model = ir.from_onnx_text(  # opset 13: vmap slices the shape (Shape has no start yet)
        '<ir_version: 10, opset_import: ["" : 13]>\n'
        "g (float[6] X, int64[K] T) => (int64[M] S) { r = Reshape (X, T)\n S = Shape (r) }"
    )
    vm = onnax.vmap(model, in_axes={"X": 0})
    inferred = vm.clone()
    infer_shapes(inferred)
    x = np.stack([np.arange(6, dtype=np.float32)] * 2)
    feeds = {"X": x, "T": np.array([2, 3])}
    np.testing.assert_array_equal(run(inferred, feeds)["S"], run(vm, feeds)["S"])
    check_vmap(vm, feeds, in_axes={"X": 0})


def _with_new_nodes(text: str) -> ir.Model:
    """The model of ``text`` inferred, then grown by untyped nodes, as a transform grows it."""
    model = ir.from_onnx_text(text)
    infer_shapes(model, record=True)
    graph = model.graph
    by_name = {v.name: v for n in graph for v in n.outputs}
    x, t = graph.inputs[0], by_name["t"]
    shape = ir.node("Shape", [t])
    grow = ir.node("Expand", [x, shape.outputs[0]])
    prod = ir.node("Mul", [grow.outputs[0], t])
    graph.extend([shape, grow, prod])
    graph.outputs.append(prod.outputs[0])
    prod.outputs[0].name = "grown"
    return model


@pytest.mark.parametrize("text", [TORCHSCRIPT_EXPAND])
def test_inferring_only_new_nodes_gives_the_shapes_of_a_full_inference(text: str) -> None:
    full, new_only = _with_new_nodes(HEADER + text), _with_new_nodes(HEADER + text)
    known = [n for n in new_only.graph if all(o.shape is not None for o in n.outputs)]
    infer_shapes(full)
    infer_shapes(new_only, new_only=True)
    assert ir.to_proto(new_only).SerializeToString() == ir.to_proto(full).SerializeToString()
    grown = new_only.graph.outputs[-1]
    assert grown.shape is not None and list(grown.shape.dims) == [2, 3, 4]
    assert known and all(n.domain == "" for n in known)  # passed over, then given back


def test_inferring_only_new_nodes_passes_over_the_known_ones() -> None:
    # Known nodes left as the recording inference saw them are passed over; one whose output
    # was changed since (a shape a full inference refines) is not: it is inferred again.
    model = _with_new_nodes(HEADER + TORCHSCRIPT_EXPAND)
    t = next(v for n in model.graph for v in n.outputs if v.name == "t")
    passed_over = unchanged(model)
    assert t.producer() in passed_over
    assert all(n.graph is model.graph for n in passed_over)
    t.shape = ir.Shape([2, 3, "k"])
    assert t.producer() not in unchanged(model)
    infer_shapes(model, new_only=True)
    assert t.shape is not None and t.shape.dims[2] == 4


def test_inferring_only_new_nodes_infers_what_inference_has_not_seen() -> None:
    # A node added since the last inference is inferred though a rule gave it a full shape,
    # and so is a known node with a dimension made unknown since.
    model = _with_new_nodes(HEADER + TORCHSCRIPT_EXPAND)
    infer_shapes(model, record=True)
    graph = model.graph
    t = next(v for n in graph for v in n.outputs if v.name == "t")
    neg = ir.node("Neg", [t])
    neg.outputs[0].type = ir.TensorType(ir.DataType.DOUBLE)
    neg.outputs[0].shape = ir.Shape(["p", "q", "r"])
    absolute = ir.node("Abs", [neg.outputs[0]])
    graph.extend([neg, absolute])
    graph.outputs.append(absolute.outputs[0])
    absolute.outputs[0].name = "absolute"
    tanh_input = next(v for n in graph for v in n.outputs if v.name == "a")
    tanh_input.shape = ir.Shape([2, 3, None])
    infer_shapes(model, new_only=True)
    assert neg.outputs[0].shape is not None and list(neg.outputs[0].shape.dims) == [2, 3, 4]
    assert tanh_input.shape is not None and list(tanh_input.shape.dims) == [2, 3, 4]
