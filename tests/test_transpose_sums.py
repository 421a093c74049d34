"""Cotangent sums of the reverse sweep: an ``Expand``ed term is added before its Expand.

A reduction's transpose hands back ``Expand(r, shape)``; summed with another cotangent of the
same value it is added as ``r`` (Add broadcasts it), so no full-size Expand runs. Checked
against central differences, with the Expand gone from the gradient graph.
"""

from __future__ import annotations

import numpy as np
import onnx.parser
import onnx_ir as ir
import pytest

from oracles import check_grad


def _model(text: str) -> ir.Model:
    return ir.from_proto(
        onnx.parser.parse_model('<ir_version: 10, opset_import: ["" : 17]>\n' + text)
    )


def _full_size_expands(model: ir.Model) -> list[ir.Node]:
    return [
        n
        for n in model.graph
        if n.op_type == "Expand"
        and n.outputs[0].shape is not None
        and n.outputs[0].shape.rank() > 0
        and n.outputs[0].shape.numpy() == (4, 5, 6)
    ]


LAYER_NORM = """
g (float[4, 5, 6] X, float[6] S, float[6] B, float[4, 5, 6] R) => (float L) {
    Y = LayerNormalization<axis=-1>(X, S, B)
    P = Mul(Y, R)
    L = ReduceSum<keepdims=0>(P)
}
"""

# X reaches the loss directly and through a mean over the last axis: its cotangent is the sum of
# a full-size term and the mean's Expand, in either order.
MEAN_RESIDUAL = {
    "mean-second": """
g (float[4, 5, 6] X, float[4, 5, 6] R) => (float L) {
    M = ReduceMean<axes=[-1], keepdims=1>(X)
    Z = Mul(X, R)
    Y = Add(Z, M)
    Q = Mul(Y, Y)
    L = ReduceSum<keepdims=0>(Q)
}
""",
    "mean-first": """
g (float[4, 5, 6] X, float[4, 5, 6] R) => (float L) {
    M = ReduceMean<axes=[-1], keepdims=1>(X)
    Y = Add(M, X)
    Z = Mul(Y, R)
    Q = Mul(Z, Y)
    L = ReduceSum<keepdims=0>(Q)
}
""",
}


def _feeds(model: ir.Model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        v.name: rng.standard_normal(tuple(v.shape.numpy())).astype(np.float32)
        for v in model.graph.inputs
        if v.shape is not None
    }


def test_layer_norm_backward_expands_nothing_full_size() -> None:
    model = _model(LAYER_NORM)
    feeds = _feeds(model)
    feeds["X"] = feeds["X"] * 2.0 + 0.5
    gm = check_grad(model, feeds, ["X", "S", "B"], "L")
    assert not _full_size_expands(gm), [n.op_type for n in gm.graph]


@pytest.mark.parametrize("name", sorted(MEAN_RESIDUAL))
def test_expanded_term_added_unexpanded(name: str) -> None:
    model = _model(MEAN_RESIDUAL[name])
    gm = check_grad(model, _feeds(model), ["X"], "L")
    assert not _full_size_expands(gm), [n.op_type for n in gm.graph]


def test_sum_of_two_expands_keeps_one() -> None:
    """Both terms Expanded (two means of X): one Expand stays, so the sum has X's shape."""
    model = _model(
        """
g (float[4, 5, 6] X) => (float L) {
    A = ReduceMean<axes=[-1], keepdims=1>(X)
    B = ReduceMean<axes=[1], keepdims=1>(X)
    C = Mul(A, B)
    D = Mul(C, C)
    L = ReduceSum<keepdims=0>(D)
}
"""
    )
    gm = check_grad(model, _feeds(model), ["X"], "L")
    assert len(_full_size_expands(gm)) == 1, [n.op_type for n in gm.graph]
