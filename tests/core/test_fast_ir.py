"""new_shape builds the very object ir.Shape builds (the oracle), state and behaviour."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from onnax.core import fast_ir
from onnax.core.fast_ir import new_shape

_DIMS = [
    [],
    [3],
    [ir.SymbolicDim("N"), 4, 8],
    [ir.SymbolicDim(None), 1, ir.SymbolicDim("M")],
]


def test_builds_directly() -> None:
    """On the installed onnx_ir the direct construction is the one in use."""
    assert fast_ir._BUILD is fast_ir._direct


@pytest.mark.parametrize("dims", _DIMS)
def test_same_state_as_the_constructor(dims: list[fast_ir.Dim]) -> None:
    mine, theirs = new_shape(list(dims)), ir.Shape(dims)
    assert fast_ir._state(mine) == fast_ir._state(theirs)
    assert mine == theirs and mine.dims == theirs.dims
    assert not mine.frozen and [mine.get_denotation(i) for i in range(len(dims))] == [None] * len(
        dims
    )
    proto_a = ir.to_proto(ir.Value(name="v", type=ir.TensorType(ir.DataType.FLOAT), shape=mine))
    proto_b = ir.to_proto(ir.Value(name="v", type=ir.TensorType(ir.DataType.FLOAT), shape=theirs))
    assert proto_a == proto_b


def test_shape_is_mutable_like_the_constructors() -> None:
    shape = new_shape([1, 2])
    shape[0] = 5
    assert shape.dims == (5, 2)
    shape.freeze()
    with pytest.raises(TypeError):
        shape[1] = 3
