"""Float accumulation for the derivative part of a half-precision model.

By default a derivative is computed in the element type of the values it combines with, so a
FLOAT16 model gets FLOAT16 derivatives. Reverse mode sums many terms, though: a cotangent is
summed back over every broadcast axis (``ReduceSum`` in ``unbroadcast``), a weight gradient is a
``MatMul``/``Gemm``/``Conv`` over the whole batch, gathers transpose to scatter-adds. A runtime
that accumulates in the storage type (BFLOAT16 keeps 8 significant bits: 256 + 1 rounds back to
256) loses the derivative entirely on long sums. ``accumulate="float32"`` runs each such node
that onnax *emitted* on FLOAT copies of its half inputs and casts its results back: one rounding
per result instead of one per term. The primal nodes are left alone, so the primal outputs are
bit-identical to the source model's.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

import onnx_ir as ir

from onnax.core import traverse
from onnax.core.inference import infer_shapes
from onnax.core.selection import HALF_TYPES
from onnax.errors import SelectionError

__all__ = ["ACCUMULATING_OPS", "Accumulate", "accumulate_in_float", "check_accumulate"]

Accumulate = Literal["model", "float32"]
"""``"model"``: derivatives in the model's own element types; ``"float32"``: sums in FLOAT."""

# Operators whose results are long sums of products: where per-term rounding in a half type
# compounds. Elementwise operators round once per result whatever the type, so they stay.
ACCUMULATING_OPS = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceSumSquare",
        "MatMul",
        "Gemm",
        "Conv",
        "ConvTranspose",
        "Einsum",
        "ScatterND",
        "ScatterElements",
        "Sum",
        "CumSum",
    }
)


def check_accumulate(accumulate: object, transform: str) -> Accumulate:
    """Validates the ``accumulate`` argument of a transform.

    Raises:
        SelectionError: For any value other than ``"model"`` or ``"float32"``.
    """
    if accumulate not in ("model", "float32"):
        raise SelectionError(
            f"{transform}: accumulate={accumulate!r} is not a precision policy, expected "
            "'model' (derivatives in the model's element types) or 'float32' (sums of "
            "FLOAT16/BFLOAT16 derivatives in FLOAT). Pass one of the two"
        )
    return "float32" if accumulate == "float32" else "model"


def accumulate_in_float(
    model: ir.Model, primal: Collection[ir.Node], accumulate: Accumulate
) -> int:
    """Runs nodes that onnax emitted on FLOAT copies of their FLOAT16/BFLOAT16 inputs.

    Two kinds of node change, each only where it has a half input, and never a node of
    ``primal``: with ``accumulate="float32"``, every accumulating node of the main graph (nodes
    inside control-flow bodies keep the model's precision, so that a body copied by forward mode
    still computes the primal bit for bit); whatever ``accumulate``, every scatter with a
    reduction in any graph, because onnxruntime's CPU provider has no FLOAT16 kernel for
    ``ScatterND``/``ScatterElements`` with ``reduction`` add or mul (they transpose gathers).
    Each rewritten node runs in FLOAT and its half outputs are cast back, under the same names.

    Args:
        model: A transformed model; rewritten in place.
        primal: The nodes that came from the source model (left as they are).
        accumulate: The policy of the transform.

    Returns:
        The number of nodes rewritten.
    """
    main = model.graph
    # onnax.core.traverse walks the graphs as onnx_ir's all_nodes does, without its per-attribute
    # protocol checks (most of the cost of a walk over a large derivative model).
    # Every node is asked (a derivative model has tens of thousands): a loop testing the
    # operator before calling anything.
    in_float32 = accumulate == "float32"
    candidates = []
    for n in traverse.all_nodes(main):
        if n.domain != "" or n in primal:
            continue
        op_type = n.op_type
        if (op_type in _SCATTERS and _scatter_with_reduction(n)) or (
            in_float32 and n.graph is main and op_type in ACCUMULATING_OPS
        ):
            candidates.append(n)
    if not candidates or not _holds_half(model):
        return 0
    # Emitted values need not carry their element type yet: inference gives it to all of them.
    infer_shapes(model)
    replaced: dict[ir.Graph, list[ir.Node]] = {}
    for node in candidates:
        owner = node.graph
        if owner is not None and any(v is not None and v.dtype in HALF_TYPES for v in node.inputs):
            _in_float(owner, node)
            replaced.setdefault(owner, []).append(node)
    # One removal per graph: each call makes a set of the graph's outputs.
    for owner, nodes in replaced.items():
        owner.remove(nodes, safe=True)
    if replaced:
        for graph in traverse.model_graphs(model):
            graph.sort()
    return sum(len(nodes) for nodes in replaced.values())


def _holds_half(model: ir.Model) -> bool:
    """Whether any typed value is FLOAT16/BFLOAT16.

    Otherwise there is nothing to do, and the model is left exactly as it is (no inference
    writing shapes into it). The primal values are typed by prepare's inference, and no rule
    emits a half value from non-half ones.
    """
    graph = model.graph
    values = [*graph.inputs, *(v for n in traverse.all_nodes(graph) for v in n.outputs)]
    return any(v.dtype in HALF_TYPES for v in values)


_SCATTERS = ("ScatterND", "ScatterElements")


def _scatter_with_reduction(node: ir.Node) -> bool:
    return node.op_type in _SCATTERS and node.attributes.get_string("reduction", "none") != "none"


def _in_float(graph: ir.Graph | ir.Function, node: ir.Node) -> None:
    """Puts Cast(FLOAT) -> the same op in FLOAT -> Cast back in ``node``'s place.

    ``node`` is left detached from its inputs and outputs; the caller removes it.
    """
    new_nodes: list[ir.Node] = []
    inputs: list[ir.Value | None] = []
    for v in node.inputs:
        if v is not None and v.dtype in HALF_TYPES:
            cast = ir.Node("", "Cast", [v], attributes=[ir.AttrInt64("to", ir.DataType.FLOAT)])
            cast.outputs[0].dtype = ir.DataType.FLOAT
            cast.outputs[0].shape = v.shape
            new_nodes.append(cast)
            inputs.append(cast.outputs[0])
        else:
            inputs.append(v)
    wide = ir.Node(
        node.domain,
        node.op_type,
        inputs,
        attributes=list(node.attributes.values()),
        num_outputs=len(node.outputs),
        name=node.name,
    )
    new_nodes.append(wide)
    for old, new in zip(node.outputs, wide.outputs, strict=True):
        half = old.dtype
        if half is None or half not in HALF_TYPES:
            new.type, new.shape = old.type, old.shape
            _take_place(old, new)
            continue
        new.dtype, new.shape = ir.DataType.FLOAT, old.shape
        back = ir.Node("", "Cast", [new], attributes=[ir.AttrInt64("to", half)])
        back.outputs[0].dtype, back.outputs[0].shape = half, old.shape
        new_nodes.append(back)
        _take_place(old, back.outputs[0])
    graph.insert_before(node, new_nodes)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)


def _take_place(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere, graph outputs included, under its name."""
    name = old.name
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name = None
    new.name = name
