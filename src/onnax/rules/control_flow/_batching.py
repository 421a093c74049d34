"""What the batch rules of If, Loop and Scan share.

Per-example selection (``Where`` spelled for onnxruntime's kernels), the fixpoint that decides
which loop-carried states are batched, and small accessors of bodies.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import BatchedBody, Batcher, detach
from onnax.core.diagnostics import node_label, op_label

__all__ = [
    "along",
    "copy_graph",
    "graph_attr",
    "initial_state",
    "is_tensor",
    "per_example",
    "select",
    "state_fixpoint",
    "vmap_label",
]


def vmap_label(bx: Batcher, node: ir.Node) -> str:
    """How messages name the node: transform, operator, opset and node."""
    return f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)})"


def graph_attr(node: ir.Node, name: str) -> ir.Graph:
    """The subgraph attribute ``name`` of ``node``."""
    return node.attributes[name].as_graph()


def copy_graph(graph: ir.Graph) -> ir.Graph:
    """A copy of a body to batch (it may read values of enclosing graphs)."""
    return graph.clone(allow_outer_scope_values=True)


def is_tensor(value: ir.Value) -> bool:
    """Whether ``value`` is a tensor (or of unknown type), not a sequence or optional."""
    return value.type is None or isinstance(value.type, ir.TensorType)


def per_example(bx: Batcher, value: ir.Value, batched: bool) -> ir.Value:
    """A one-element-per-example value as ``[B]`` (batched) or ``[1]`` (shared, broadcasts)."""
    return bx.op("Reshape", [value, bx.batch_size if batched else bx.ints([1])])


def along(bx: Batcher, flat: ir.Value, rank: int) -> ir.Value:
    """A ``[B]`` value with ``rank`` trailing size-1 axes, to broadcast against ``[B, ...]``."""
    return bx.unsqueeze(flat, list(range(1, rank + 1)))


# Element types onnxruntime's Where kernel serves; others go through And/Or or a wider type.
_WHERE_TYPES = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.DOUBLE,
        ir.DataType.FLOAT16,
        ir.DataType.INT8,
        ir.DataType.UINT8,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.STRING,
    }
)
_WIDER = {
    ir.DataType.INT16: ir.DataType.INT32,
    ir.DataType.UINT16: ir.DataType.INT32,
    ir.DataType.UINT32: ir.DataType.INT64,
    ir.DataType.UINT64: ir.DataType.INT64,
    ir.DataType.BFLOAT16: ir.DataType.FLOAT,
}


def select(
    bx: Batcher, cond: ir.Value, a: ir.Value, b: ir.Value, dtype: ir.DataType | None
) -> ir.Value:
    """``Where(cond, a, b)``, spelled so that onnxruntime has a kernel for the element type."""
    if dtype is None or dtype in _WHERE_TYPES:
        return bx.op("Where", [cond, a, b])
    if dtype == ir.DataType.BOOL:
        keep = bx.op("And", [bx.op("Not", [cond]), b])
        return bx.op("Or", [bx.op("And", [cond, a]), keep])
    wide = _WIDER.get(dtype)
    if wide is None:
        return bx.op("Where", [cond, a, b])
    cast = [bx.op("Cast", [v], {"to": int(wide)}) for v in (a, b)]
    return bx.op("Cast", [bx.op("Where", [cond, *cast])], {"to": int(dtype)})


def state_fixpoint(
    bx: Batcher,
    body: ir.Graph,
    flags: list[bool],
    states: Sequence[tuple[int, int]],
) -> tuple[BatchedBody, list[bool]]:
    """Batches copies of ``body`` until the batched states are stable.

    Args:
        bx: The batcher of the graph holding the loop.
        body: The original body (copies are batched, it is left alone).
        flags: Which body inputs start batched.
        states: ``(body input index, body output index)`` of each loop-carried state: a state is
            batched when its input is or its update turns out batched.

    Returns:
        The batched copy (outputs not yet written) and the final input flags.
    """
    while True:
        copy = copy_graph(body)
        result = bx.batch_body(copy, flags)
        grown = list(flags)
        for i, o in states:
            grown[i] = flags[i] or result.batched[o]
        if grown == flags:
            return result, flags
        # A trial copy is dropped: it must not keep the values it read alive.
        detach(copy)
        flags = grown


def initial_state(
    bx: Batcher, arg: ir.Value, batched: bool, original: ir.Value, want: bool
) -> ir.Value:
    """A loop's initial state, materialised batched where ``want`` asks and it is not."""
    return bx.materialize(arg, batched, original) if want and not batched else arg
