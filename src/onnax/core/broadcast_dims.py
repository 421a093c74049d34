"""Undoing the guesses shape inference makes when it broadcasts two symbolic dimensions.

onnx_shape_inference broadcasts two different symbolic dimensions (``n`` and ``m``, or ``n``
and an unknown one) by picking one of them, assuming they are equal. Either may be 1 at run
time, and then the result has the other's size. A derivative model that declares the guessed
dimension misleads onnxruntime, which plans buffers from equal dimension names ("Shape mismatch
attempting to re-use buffer {1} != {2}" in a jvp through two Loops), and the reverse-mode
rules skip the unbroadcast summation the run needs (a cotangent of the broadcast size for an
input of size 1). Here such a dimension becomes unknown, which every rule handles at run time.
"""

from __future__ import annotations

import onnx_ir as ir

from onnax.core.fast_nodes import node_list
from onnax.core.traverse import all_nodes, subgraphs

__all__ = ["forget_guessed_broadcasts"]

BROADCASTING = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "Where",
        "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor",
        "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu",
    }
)  # fmt: skip
"""Elementwise operators with multidirectional (numpy) broadcasting of all their inputs."""

Dim = int | ir.SymbolicDim


def _sound_dim(dims: list[Dim]) -> Dim | None:
    """The broadcast of one axis's dimensions, or None when it depends on run-time sizes."""
    ints = {d for d in dims if isinstance(d, int) and d != 1}
    if ints:
        return ints.pop() if len(ints) == 1 else None
    symbols = [d for d in dims if not isinstance(d, int)]
    if not symbols:
        return 1
    first = symbols[0]
    if first.value is not None and all(s == first for s in symbols):
        return first
    return None


def _forget(node: ir.Node) -> None:
    shapes: list[ir.Shape] = []
    for value in node.inputs:
        if value is None:
            continue
        shape = value.shape
        if shape is None:
            return
        shapes.append(shape)
    if not shapes:
        return
    if _sound_everywhere(shapes):
        return
    rank = max(s.rank() for s in shapes)
    padded: list[list[Dim]] = [[*([1] * (rank - s.rank())), *s.dims] for s in shapes]
    for out in node.outputs:
        if out.shape is None or out.shape.rank() != rank or out.is_graph_output():
            continue
        dims = list(out.shape.dims)
        changed = False
        for axis, inferred in enumerate(dims):
            if isinstance(inferred, int):
                continue
            sound = _sound_dim([p[axis] for p in padded])
            if sound is None and inferred.value is not None:
                dims[axis] = ir.SymbolicDim(None)
                changed = True
        if changed:
            out.shape = ir.Shape(dims)


def _sound_everywhere(shapes: list[ir.Shape]) -> bool:
    """Whether every axis of the broadcast is sound, read off the inputs' shapes at once.

    So when one input of the largest rank has only numbers and named symbols, and every
    other input's (right-aligned) dimension is 1, the same number, or the very same symbol:
    :func:`_sound_dim` then finds that number or symbol on each axis, and nothing is to
    forget. Most broadcasting nodes of a derivative model combine values of one shape, or a
    value with a scalar or a bias, and the axis by axis look cost a third of this module's time.
    """
    # Every inference asks every broadcasting node: the dimension lists are read as the
    # shapes hold them (``dims`` copies each into a tuple) and looked at in loops.
    full = shapes[0]._dims  # the first of the largest rank, as max() picks it
    for shape in shapes:
        if len(shape._dims) > len(full):
            full = shape._dims
    for d in full:
        if not isinstance(d, int) and d.value is None:
            return False
    rank = len(full)
    for shape in shapes:
        own = shape._dims
        if own is full or own == full:  # elements compared by identity first
            continue
        for d, f in zip(own, full[rank - len(own) :], strict=True):
            # Exact types: comparing a SymbolicDim runs runtime protocol checks.
            if d is f or (type(d) is int and (d == 1 or (type(f) is int and d == f))):
                continue
            return False
    return True


def forget_guessed_broadcasts(model: ir.Model) -> None:
    """Makes unknown every broadcast dimension that inference guessed, in graph order.

    A broadcast reading a corrected value is judged on the corrected shape, so chains of
    elementwise operators follow; a graph output keeps what the user declared.
    """
    graph = model.graph
    # The graph itself when it holds no bodies (subgraphs() is walked once per inference).
    for node in all_nodes(graph) if subgraphs(graph) else node_list(graph):
        # The slots, as Node.op_type and .domain return them: every node is asked.
        if node._op_type in BROADCASTING and node._domain in ("", "ai.onnx"):
            _forget(node)
