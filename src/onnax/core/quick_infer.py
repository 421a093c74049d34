"""Shape inference for the commonest nodes, onnax-side, giving just what onnx_shape_inference gives.

Most nodes a transform emits are elementwise arithmetic, ``MatMul``, ``Transpose``, ``Reshape``
to a constant shape, reductions over constant axes and the like, whose output type and shape
follow from their inputs' in a few lines; onnx_shape_inference spent most of a derivative
model's inference on them (its rules run through checks, shape copies and runtime protocol
tests). :func:`settle` infers those nodes before the engine runs, and the engine then passes
over them (:func:`onnax.core.inference.infer_shapes`); when it would have nothing left to do,
it is not run at all (:func:`engine_idle`).

Exactness is the contract: a node is settled only when its result is the one the engine's own
rule computes (same dtype, same dimensions, same names), and left to the engine otherwise:

* The rule must be the one mimicked: :data:`onnax.core.quick_rules._RULES` names, per
  operator, the engine function
  whose logic the handler copies, and a node is settled only if the engine's registry gives
  that very function for the model's opset (a newer engine with a new rule takes the node).
* Every input read must keep its type and shape through the engine's run ("final"): a graph
  input or initializer the engine has nothing to fix on, an output of a node the engine
  passes over, or one settled here. Nothing settled mints a symbol (the engine's ``_dN``
  names, numbered in order: minting here would renumber its own); the symbolic arithmetic
  of a ``Pad`` or ``Flatten`` (``N + 2``, ``4*N``) is the engine's own ``SymbolicDim``
  arithmetic, so spelled as it spells it.
* No integer input is read for its values except as a constant (``const_value``) or as the
  output of a ``Shape`` (whose contents the engine tracks, the input's dimensions), and no
  integer data passes: the engine tracks the contents of integer tensors (shape arithmetic,
  ``SYM_DATA_KEY``) and folds them into ``const_value``, which a passed-over node would not.
  A ``Shape`` itself is settled, metadata and all, only when all its consumers are.
* An output has no shape yet, or anonymous dimensions where the result has others, or the
  result already (:func:`_merged`: what the engine's refinement makes of it, recording no
  symbol equality); its type, if any, is the result's.
* A ``Reshape`` whose element counts the engine would relate (for its symbol renaming) is
  inferred by the engine again, its output final all the same (:func:`_counted`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

import onnx_ir as ir
import onnx_shape_inference as osi

from onnax.core import quick_conv
from onnax.core.fast_ir import new_shape
from onnax.core.fast_nodes import node_list
from onnax.core.quick_rules import (
    Dim,
    Known,
    Result,
    add_rules,
    handler,
    same_dim,
    shape_contents,
)
from onnax.core.traverse import subgraphs

__all__ = ["engine_idle", "settle"]

add_rules(quick_conv.RULES)  # convolutions and pooling: a module of their own


def _fully_known(shape: ir.Shape | None) -> bool:
    return shape is not None and all(isinstance(d, int) or d.value is not None for d in shape.dims)


def _initializer_final(value: ir.Value) -> bool:
    """An initializer whose declared type and shape the engine keeps (its tensor's)."""
    tensor = value.const_value
    shape = value.shape
    return (
        tensor is not None
        and value.dtype is not None
        and shape is not None
        and shape.dims == tensor.shape.dims
    )


def _merged(out: ir.Value, dtype: ir.DataType | None, shape: ir.Shape) -> ir.Shape | None:
    """The shape the engine's refinement leaves on ``out`` given the result; None if unsure.

    An output of no type or of the result's tensor type takes the result where it has no
    shape or an anonymous dimension (``ShapeInferenceContext._refine_shape``: a number or a
    name is more specific, and an anonymous dimension anchors no equality) and keeps what it
    has where that is the result already. Any other output is left to the engine.
    """
    kind = out.type
    if kind is not None and (not isinstance(kind, ir.TensorType) or kind.dtype != dtype):
        return None
    have = out.shape
    if have is None:
        return shape
    if kind is None or len(have.dims) != len(shape.dims):
        return None
    dims: list[Dim] = []
    changed = False
    for old, new in zip(have.dims, shape.dims, strict=True):
        if same_dim(old, new):
            dims.append(old)
        elif type(old) is not int and old.value is None:  # type: ignore[union-attr]
            dims.append(new)
            changed = True
        else:
            return None
    return new_shape(dims) if changed else have


def settle(model: ir.Model, skipped: Collection[ir.Node]) -> list[ir.Node]:
    """Infers the main graph's nodes that the engine would infer just so; returns them.

    A ``Shape`` of a final value is settled only when every consumer of its output is: the
    engine keeps the contents it tracks for the length of its run, so a consumer it infers
    would not find them on a passed-over ``Shape``. Its consumers are settled (or not) before
    that is known, reading the contents the engine would give them.

    Args:
        model: The model, its main graph sorted; the outputs of settled nodes are set.
        skipped: The nodes the engine will pass over in any case (their outputs are final).

    Returns:
        The settled nodes, for the engine to pass over too.
    """
    opset = model.opset_imports.get("", 1)  # the engine's own default
    graph = model.graph
    known = Known()
    final = known.final
    for value in graph.inputs:
        if value.type is not None and _fully_known(value.shape):
            final.add(value)
    for value in graph.initializers.values():
        if _initializer_final(value):
            final.add(value)
    settled: list[ir.Node] = []
    shapes: list[ir.Node] = []
    # handler() per operator once: every node of the model is asked for its rule.
    rules: dict[str, Callable[[ir.Node, Known], Result] | None] = {}
    for node in node_list(graph):
        if node in skipped:
            final.update(node.outputs)
            continue
        # Only the domain spelt "": the engine relates the element counts of those Reshapes.
        if node.domain != "":
            continue
        op_type = node.op_type
        rule = rules.get(op_type, _UNKNOWN)
        if rule is _UNKNOWN:
            rule = rules[op_type] = handler(op_type, opset)
        if rule is None:
            continue
        if op_type == "Shape":
            contents = shape_contents(node, known)
            if contents is not None:
                known.contents[node.outputs[0]] = contents
                shapes.append(node)
            continue
        try:
            result = rule(node, known)
        except Exception:  # _Unsure, or a malformed node: the engine's to report
            continue
        if _fill(node, result):
            final.update(node.outputs)
            if op_type != "Reshape" or _counted(node):
                settled.append(node)
            # else inferred again, which changes nothing but records the counts' equality
    done = set(settled)
    for node in shapes:
        out = node.outputs[0]
        if all(user in done or user in skipped for user, _ in out.uses()) and _settle_shape(
            node, known.contents[out]
        ):
            settled.append(node)
    return settled


_UNKNOWN: Any = object()
"""No handler asked for yet (a handler may be None)."""


def _fill(node: ir.Node, result: Result) -> bool:
    """Gives the node's outputs the result, or returns False leaving them as they are."""
    outputs = node.outputs
    if len(result) != len(outputs):
        return False
    if len(outputs) == 1:
        # Most nodes have one output: no list of fills, no zips (every inference fills
        # every node it settles).
        out = outputs[0]
        dtype, shape = result[0]
        merged = None if shape is None else _merged(out, dtype, shape)
        if merged is None:
            return False
        if out.shape is not merged:
            out.shape = merged
        if dtype is not None and out.type is None:
            out.dtype = dtype
        return True
    fills = []
    for out, (dtype, shape) in zip(node.outputs, result, strict=True):
        merged = None if shape is None else _merged(out, dtype, shape)
        if merged is None:
            return False
        fills.append((out, dtype, merged))
    for out, dtype, merged in fills:
        if out.shape is not merged:
            out.shape = merged
        if dtype is not None and out.type is None:
            out.dtype = dtype
    return True


def engine_idle(model: ir.Model, passed_over: Collection[ir.Node]) -> bool:
    """Whether an engine run passing over ``passed_over`` would change nothing in ``model``.

    So when it would infer no node (every node is passed over, and no graph holds bodies,
    whose inputs it would type), name no dimension (no graph input has an anonymous one;
    passed-over nodes' outputs have none) and fix no initializer's shape. Nor would it
    record an equality for its symbol renaming: it relates the element counts of the
    ``Reshape`` nodes of the default domain, and a passed-over node is in another.
    """
    graph = model.graph
    if len(passed_over) < len(graph) or subgraphs(graph):
        return False
    for node in node_list(graph):  # a loop: no generator step per node
        if node not in passed_over:
            return False
    for value in graph.inputs:
        if value.shape is not None and not _fully_known(value.shape):
            return False
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is not None and (value.shape is None or value.shape.dims != tensor.shape.dims):
            return False
    return True


def _counted(node: ir.Node) -> bool:
    """Whether passing over a settled ``Reshape`` loses no equality the engine would record."""
    x, y = node.inputs[0], node.outputs[0]
    return (
        x is None or x.shape is None or y.shape is None or _same_count(x.shape.dims, y.shape.dims)
    )


def _same_count(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    """Whether two shapes' element counts are products of the same factors (or unknown).

    The engine relates the element counts of every ``Reshape``'s input and output it infers
    (``record_reshape_numel_equalities``) for its symbol renaming, and equal counts, or one
    with an anonymous dimension, record nothing.
    """
    key = (tuple(_spelled(a)), tuple(_spelled(b)))
    if key not in _COUNTS:
        if None in key[0] or None in key[1]:
            _COUNTS[key] = True
        else:
            ints_a = [d for d in key[0] if isinstance(d, int)]
            ints_b = [d for d in key[1] if isinstance(d, int)]
            syms_a = sorted(str(d) for d in key[0] if isinstance(d, str))
            syms_b = sorted(str(d) for d in key[1] if isinstance(d, str))
            _COUNTS[key] = syms_a == syms_b and math.prod(ints_a) == math.prod(ints_b)
    return _COUNTS[key]


def _spelled(dims: Sequence[Dim]) -> list[int | str | None]:
    return [d if isinstance(d, int) else d.value for d in dims]


_COUNTS: dict[tuple[tuple[int | str | None, ...], tuple[int | str | None, ...]], bool] = {}


def _settle_shape(node: ir.Node, contents: list[Dim]) -> bool:
    """Sets a ``Shape`` output as ``infer_shape`` does, contents and all; False if it cannot."""
    out = node.outputs[0]
    merged = _merged(out, ir.DataType.INT64, ir.Shape([len(contents)]))
    if merged is None or out.is_graph_output():
        return False
    if out.shape is not merged:
        out.shape = merged
    if out.type is None:
        out.dtype = ir.DataType.INT64
    # ShapeInferenceContext.set_symbolic_value, the run's own map aside (see settle).
    out.metadata_props[osi.SYM_DATA_KEY] = json.dumps(
        [x if isinstance(x, int) else str(x) for x in contents]
    )
    numbers = [d for d in contents if isinstance(d, int)]
    if len(numbers) == len(contents) and out.const_value is None:
        out.const_value = ir.tensor(numbers, dtype=ir.DataType.INT64, name=out.name)
    return True
