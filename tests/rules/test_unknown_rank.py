"""vmap through values whose rank shape inference cannot know.

A ``Squeeze`` without axes of a value with run-time dimensions (here a ``Reshape`` to a shape
input) has a rank only the run time knows: which dimensions are 1? The ONNX function body of
AffineGrid does this. The batch rules that need no rank then must not ask for one: ``Unsqueeze``
with non-negative axes, ``Concat`` and ``Split`` along a non-negative axis, ``Transpose`` with a ``perm``
(its length is the rank) and ``MatMul`` of a batched operand of unknown rank with a shared
matrix or vector. Oracle: vmap against a loop of single onnxruntime runs (tests/oracles.py), float
and double, at opsets 13, 21 and 25 (before 13 a Squeeze without axes of run-time dimensions is
refused: it would need its axes as an input).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from onnax.errors import UnsupportedOperatorError
from oracles import check_adjoint, check_vjp, check_vmap

TEXT = """
g ({T}[6] x, int64[3] s, {T}[2, 4] w) => ({T} y) {
    r = Reshape (x, s)
    sq = Squeeze (r)
    one = Constant <value_ints = [1]> ()
    u = Unsqueeze (sq, one)
    c2 = Concat <axis = 1> (u, u)
    halves = Constant <value_ints = [2, 2]> ()
    c4 = Concat <axis = 1> (c2, c2)
    c, d = Split <axis = 1> (c4, halves)
    t = Transpose <perm = [0, 2, 1]> (c)
    y = MatMul (t, w)
}
"""


def _model(dtype: str, opset: int) -> ir.Model:
    text = TEXT.replace("{T}", dtype)
    return ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{text}')


def _feeds(dtype: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    np_dtype = np.float32 if dtype == "float" else np.float64
    return {
        "x": rng.standard_normal((6,)).astype(np_dtype),
        "s": np.array([2, 1, 3], np.int64),
        "w": rng.standard_normal((2, 4)).astype(np_dtype),
    }


@pytest.mark.parametrize("opset", [13, 21, 25])
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_vmap_through_unknown_rank(dtype: str, opset: int) -> None:
    model = _model(dtype, opset)
    feeds = _feeds(dtype)
    for in_axes in ((0, None, None), (1, None, None)):
        check_vmap(model, feeds, in_axes=in_axes)


def test_matmul_with_a_batched_matrix_needs_the_rank_of_the_other() -> None:
    # A shared operand of unknown rank against a batched matrix: whether its leading dimensions
    # line up with the batch axis depends on its rank, so the rule asks for it.
    model = _model("float", 13)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes=(None, None, 0))
    message = str(err.value)
    assert "ai.onnx::MatMul" in message and "rank of its input 0 't'" in message
    assert "Remedy" in message


REVERSE = """
g ({T}[6] x, int64[3] s, {T}[2, 4] w) => ({T} y) {
    r = Reshape (x, s)
    sq = Squeeze (r)
    c = Concat <axis = 0> (sq, sq)
    p = MatMul (c, w)
    y = ReduceSum <keepdims = 0> (p)
}
"""


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("opset", [13, 21])
def test_reverse_mode_through_values_of_unknown_rank(dtype: str, opset: int) -> None:
    """MatMul's transpose against a shared matrix and Concat's along a non-negative axis need
    no rank: vjp against finite differences and the adjoint identity, w.r.t. both operands."""
    text = REVERSE.replace("{T}", dtype)
    model = ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{text}')
    np_dtype = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal(6).astype(np_dtype),
        "s": np.array([1, 3, 2], np.int64),
        "w": rng.standard_normal((2, 4)).astype(np_dtype),
    }
    check_vjp(model, feeds, ["x", "w"])
    check_adjoint(model, feeds, ["x", "w"])


SLICED = """
g ({T}[6] x, int64[3] s, {T}[2, 4] w, {T}[16] v) => ({T} y) {
    r = Reshape (x, s)
    sq = Squeeze (r)
    b = Constant <value_ints = [1, -4]> ()
    e = Constant <value_ints = [100, 9223372036854775807]> ()
    a = Constant <value_ints = [0, -1]> ()
    k = Slice (sq, b, e, a)
    c = Concat <axis = 0> (k, k)
    p = MatMul (c, w)
    z = Constant <value_ints = [-1, 4]> ()
    flat = Reshape (v, z)
    like = CastLike (flat, p)
    q = MatMul (p, like)
    y = ReduceSum <keepdims = 0> (q)
}
"""


@pytest.mark.parametrize("starts", ["constant", "input"])
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_reverse_mode_slice_and_shapes_that_do_not_depend_on_a_guess(
    dtype: str, starts: str
) -> None:
    """A unit-step Slice of a value of unknown rank is transposed by a Pad over its axes
    (opset 18+), with Slice's clamping and negative bounds at run time; and a CastLike or a
    Reshape to a constant shape keeps the shape inference gives it even when another input's
    rank is only a guess. vjp against finite differences and the adjoint identity."""
    text = SLICED.replace("{T}", dtype)
    if starts == "input":  # the bounds known at run time only
        text = text.replace(f"{dtype}[16] v)", f"{dtype}[16] v, int64[2] b)")
        text = text.replace("    b = Constant <value_ints = [1, -4]> ()\n", "")
    model = ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : 21]>\n{text}')
    np_dtype = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal(6).astype(np_dtype),
        "s": np.array([1, 3, 2], np.int64),  # sq is [3, 2]; k its rows 1 and 2
        "w": rng.standard_normal((2, 4)).astype(np_dtype),
        "v": rng.standard_normal(16).astype(np_dtype),
    }
    if starts == "input":
        feeds["b"] = np.array([1, -4], np.int64)
    check_vjp(model, feeds, ["x", "w", "v"])
    check_adjoint(model, feeds, ["x", "w", "v"])
