"""Completing the shapes that onnx_shape_inference leaves unknown.

Exporters (TorchScript above all) compute the shapes of masks and broadcasts at run time:
``Expand(mask, Where(Equal(c, ConstantOfShape(..) * -1), ConstantOfShape(..), c))``, with
``c`` a constant or ``Shape``/``Gather``/``Concat`` arithmetic on static dimensions.
onnx_shape_inference propagates the contents of shape vectors through some of those operators
but not through ``ConstantOfShape``, ``Equal`` or a ``Where`` whose branches differ, so the
``Expand`` gets no shape and nor does anything computed from it: rules that need a rank refuse.

:func:`complete_shapes` closes that gap in two ways, alternating with onnx_shape_inference
until nothing more is learnt:

* **Folding.** A node whose inputs are all constant (initializers, ``Constant`` nodes, values
  folded before) and whose result is small gets that result as its outputs' ``const_value``,
  as onnx_shape_inference itself does for the shape vectors it can compute. ``Shape`` and
  ``Size`` of a value with a static shape are constant too. The graph is not changed: only
  values are annotated, so nothing a caller holds (nodes, names) moves.
* **The other engine.** ``onnx.shape_inference.infer_shapes`` (data propagation on, strict mode
  off) runs on the model's skeleton (weights demoted to inputs, see
  :func:`onnax.core.skeleton.skeleton_proto`), and its answer is taken for the values that
  still have no shape or no type. It never replaces a shape onnx_shape_inference gave, and only
  its numbers are taken: its symbolic dimensions (its own placeholders ``unk__3``, and symbols
  it may have broadcast by a guess) become anonymous ones.

A reduction with ``keepdims`` over axes known at run time keeps its input's rank, which
neither engine says (:func:`_kept_rank`).

All only ever add knowledge that holds for every run of the model, so the guessed ranks of a
``Squeeze`` without axes (see :func:`onnax.core.inference.infer_shapes`) are excluded from both
and cleared afterwards as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence, Set

import numpy as np
import onnx
import onnx.helper
import onnx.shape_inference
import onnx_ir as ir

from onnax.core.diagnostics import RANDOM_OPS
from onnax.core.fast_nodes import node_list
from onnax.core.inferred import passable
from onnax.core.skeleton import skeleton_proto
from onnax.core.static import array_tensor, evaluate, static_shape
from onnax.core.traverse import subgraphs

__all__ = ["MAX_FOLDED_ELEMENTS", "complete_shapes"]

logger = logging.getLogger(__name__)

MAX_FOLDED_ELEMENTS = 1024
"""Results larger than this are not folded: shape arithmetic is small, masks and data are not."""

_MAX_ROUNDS = 6
"""Rounds of folding + re-inference. Each round only runs when the previous one learnt
something a consumer can use; chains of Shape-of-Expand-of-Shape need one round per link."""

_NOT_FOLDED = RANDOM_OPS | {"Constant", "If", "Loop", "Scan", "SequenceConstruct"}
"""Operators whose outputs are not a function of their inputs' values alone (random ones),
or that hold subgraphs, or whose result is no tensor."""

_EXACT_TYPES = frozenset(
    {
        ir.DataType.INT64,
        ir.DataType.INT32,
        ir.DataType.INT16,
        ir.DataType.INT8,
        ir.DataType.UINT64,
        ir.DataType.UINT32,
        ir.DataType.UINT16,
        ir.DataType.UINT8,
        ir.DataType.BOOL,
    }
)
"""Shape arithmetic is integer (and boolean for the conditions of ``Where``)."""

_EXACT_FLOAT_OPS = frozenset(
    {"Abs", "Add", "Cast", "Ceil", "Concat", "ConstantOfShape", "Div", "Equal", "Expand"}
    | {"Floor", "Gather", "Identity", "Max", "Min", "Mul", "Neg", "Reshape", "Round", "Slice"}
    | {"Sqrt", "Squeeze", "Sub", "Unsqueeze", "Where"}
)
"""Operators whose float results are exactly rounded (IEEE) or copied, so that folding them
gives the runtime's bits: exporters compute resized sizes as ``Floor(Cast(Shape) * scale)``.
Others (Exp, Pow...) may round differently from one implementation to the next."""


def complete_shapes(
    model: ir.Model,
    infer: Callable[[ir.Model, Sequence[ir.Node]], None],
    guessed: Callable[[ir.Graph], Set[ir.Value]],
) -> None:
    """Folds static shape arithmetic and adopts onnx.shape_inference's answers, in place.

    Args:
        model: A model on which ``infer`` has run once (its graphs sorted).
        infer: Runs onnx_shape_inference on ``model`` again (it refines, never overrides),
            passing over the given nodes (:func:`_unaffected`).
        guessed: The values of a graph whose shapes rest on a guessed rank; they are neither
            folded nor given the other engine's shapes.
    """
    adopted = False
    for _ in range(_MAX_ROUNDS):
        changed: set[ir.Value] = set()
        learnt = _fold(model, guessed, changed)
        learnt = _keep_ranks(model, guessed, changed) or learnt
        if not learnt and not adopted:
            adopted = True
            learnt = _adopt_onnx_shapes(model, guessed, changed)
        if not learnt:
            return
        infer(model, _unaffected(model, changed))


def _unaffected(model: ir.Model, changed: Set[ir.Value]) -> list[ir.Node]:
    """The nodes that the next round may pass over: none of their inputs depends on ``changed``.

    A round after folding used to infer every node, though folding mostly annotates a few
    hundred small weights (a batch normalization's scale, ``Unsqueeze``-d): only their
    consumers can learn something, and what those learn travels on. It stops at an output
    with a static floating-point shape: inferring its producer again cannot refine its
    numbers, and inference keeps no contents of floating-point values for their consumers.
    A node that inference must not pass over (:func:`onnax.core.inferred.passable`) is
    inferred in any case.
    """
    reached = set(changed)
    unaffected = []
    for graph in _graphs(model.graph):
        for node in graph:
            if any(v in reached for v in node.inputs if v is not None):
                reached.update(out for out in node.outputs if not _settled(out))
            elif passable(node):
                unaffected.append(node)
    return unaffected


def _settled(value: ir.Value) -> bool:
    shape = value.shape
    return (
        value.dtype is not None
        and value.dtype.is_floating_point()
        and shape is not None
        and all(isinstance(d, int) for d in shape.dims)
    )


# ------------------------------------------------------------------------------ folding
def _graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    yield graph
    yield from subgraphs(graph)


def _known(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The tensor of a value known before run time, or None (reading no data)."""
    if value is None:
        return None
    tensor = value.const_value
    if tensor is None:
        node = value.producer()
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            return None
        attr = node.attributes.get("value")
        if attr is not None and attr.type == ir.AttributeType.TENSOR and not attr.is_ref():
            # Read directly: get_const_tensor checks the attribute against a runtime
            # protocol, which costs more than everything else here on a big graph.
            tensor = attr.value
        else:
            tensor = ir.convenience.get_const_tensor(value)
        if tensor is None:
            return None
        value.const_value = tensor  # what emitted constants carry too (core/emit.py)
    return tensor if tensor.size <= MAX_FOLDED_ELEMENTS else None


def _foldable(node: ir.Node) -> bool:
    # Every round asks every node (tens of thousands in a derivative model): loops rather
    # than generators, and the attributes read from the dict under the UserDict.
    op_type = node.op_type
    if node.domain not in _DEFAULT_DOMAIN or op_type in _NOT_FOLDED:
        return False
    outputs = node.outputs
    for out in outputs:
        if out.const_value is not None:
            return False  # folded before (or by onnx_shape_inference)
    if op_type not in _EXACT_FLOAT_OPS:
        for out in outputs:
            dtype = out.dtype
            if dtype is not None and dtype not in _EXACT_TYPES:
                return False
    for a in node._attributes.data.values():  # noqa: SIM110 (a loop: no generator per node)
        if a.type in _BODIES or a.is_ref():
            return False
    return True


_DEFAULT_DOMAIN = ("", "ai.onnx")
_BODIES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _results(node: ir.Node, opset: int) -> list[np.ndarray] | None:
    if node.op_type in ("Shape", "Size"):
        static = static_shape(node)
        return None if static is None else [static]
    # Every input is looked at, known or not (_known annotates the outputs of Constants).
    tensors = []
    missing = False
    for v in node.inputs:
        t = _known(v)
        if t is None and v is not None:
            missing = True
        tensors.append(t)
    if missing:
        return None
    if all(t is None for t in tensors):
        return None  # no inputs, or only omitted optional ones: nothing to fold
    args = [None if t is None else t.numpy() for t in tensors]
    if node.op_type == "Identity":
        return [args[0]] if args[0] is not None else None  # the commonest, without the evaluator
    try:
        results = evaluate(node, args, opset)
    except Exception:  # left computed: the runtime evaluates it
        logger.debug("not folded: %s %r", node.op_type, node.name, exc_info=True)
        return None
    if sum(r.size for r in results) > MAX_FOLDED_ELEMENTS:
        return None
    if node.op_type not in _EXACT_FLOAT_OPS and any(
        ir.DataType.from_numpy(r.dtype) not in _EXACT_TYPES for r in results
    ):
        return None
    return results


def _agrees(value: ir.Value, array: np.ndarray) -> bool:
    if value.dtype is not None and value.dtype != ir.DataType.from_numpy(array.dtype):
        return False
    shape = value.shape
    if shape is None:
        return True
    return shape.rank() == array.ndim and all(
        not isinstance(d, int) or d == n for d, n in zip(shape.dims, array.shape, strict=True)
    )


def _fold(
    model: ir.Model, guessed: Callable[[ir.Graph], Set[ir.Value]], changed: set[ir.Value]
) -> bool:
    """Annotates every newly constant value (into ``changed``); True if one of them feeds a node."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    learnt = False
    for graph in _graphs(model.graph):
        skip = guessed(graph)
        for node in node_list(graph):
            if not _foldable(node) or (skip and any(v in skip for v in node.inputs)):
                continue
            results = _results(node, opset)
            if results is None:
                continue
            if not all(
                _agrees(out, array) for out, array in zip(node.outputs, results, strict=True)
            ):
                # The inference and the reference disagree: trust neither.
                logger.debug("not folded (shapes disagree): %s %r", node.op_type, node.name)
                continue
            for out, array in zip(node.outputs, results, strict=True):
                changed.add(out)
                out.const_value = array_tensor(array)
                if out.dtype is None:
                    out.dtype = ir.DataType.from_numpy(array.dtype)
                if out.shape is None:
                    # A shape already there stays, symbolic dimensions and all: a graph
                    # output keeps the interface its author declared.
                    out.shape = ir.Shape(list(array.shape))
                learnt = learnt or bool(out.uses())
    return learnt


# ------------------------------------------------------------------------ kept ranks
_REDUCTIONS = frozenset(
    {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean"}
    | {"ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"}
)


def _kept_rank(node: ir.Node) -> ir.Shape | None:
    """The shape of a reduction with ``keepdims`` over axes known at run time only.

    Neither engine gives one, yet the rank is the input's, and a dimension of 1 stays 1:
    onnax reduces cotangents that way wherever broadcasting involved a symbolic dimension
    (``unbroadcast`` with axes from ``NonZero(Shape(x) == 1)``), and the batch rules of the
    consumers need the rank (vmap of a grad).
    """
    if node.op_type not in _REDUCTIONS or node.domain not in ("", "ai.onnx"):
        return None
    if not node.attributes.get_int("keepdims", 1) or not node.inputs:
        return None
    x = node.inputs[0]
    if x is None or x.shape is None:
        return None
    return ir.Shape([1 if d == 1 else None for d in x.shape.dims])


def _keep_ranks(
    model: ir.Model, guessed: Callable[[ir.Graph], Set[ir.Value]], changed: set[ir.Value]
) -> bool:
    learnt = False
    for graph in _graphs(model.graph):
        skip: Set[ir.Value] | None = None
        for node in node_list(graph):
            if not node.outputs or node.outputs[0].shape is not None:
                continue
            shape = _kept_rank(node)
            if shape is None:
                continue
            skip = guessed(graph) if skip is None else skip
            if node.inputs[0] in skip:
                continue
            node.outputs[0].shape = shape
            changed.add(node.outputs[0])
            learnt = True
    return learnt


# ----------------------------------------------------------------- onnx.shape_inference
def _proto_types(graph: onnx.GraphProto, into: dict[str, list[onnx.TypeProto]]) -> None:
    for info in (*graph.value_info, *graph.output):
        into.setdefault(info.name, []).append(info.type)
    for node in graph.node:
        for attr in node.attribute:
            for sub in (attr.g,) if attr.HasField("g") else attr.graphs:
                _proto_types(sub, into)


def _shape_of(tensor_type: onnx.TypeProto.Tensor) -> ir.Shape | None:
    """The shape onnx gives, with its numbers; its symbolic dimensions become anonymous.

    onnx broadcasts an unknown dimension against a symbolic one to the symbol (``Expand`` of
    ``[N, 1]`` to a shape known at run time gives ``[N, unk__0]``), which is a guess: with
    ``N = 1`` the result has the target's length. Its numbers do not have that problem (a
    dimension other than 1 broadcasts to itself or the model is invalid).
    """
    if not tensor_type.HasField("shape"):
        return None
    return ir.Shape(
        [int(d.dim_value) if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    )


def _adopt_onnx_shapes(
    model: ir.Model, guessed: Callable[[ir.Graph], Set[ir.Value]], changed: set[ir.Value]
) -> bool:
    """Gives onnx.shape_inference's shape (and type) to values that have none (into ``changed``)."""
    wanting = [
        (graph, out)
        for graph in _graphs(model.graph)
        for node in graph
        if not (node.op_type == "Shape" and node.domain in ("", "ai.onnx"))
        for out in node.outputs
        if out.name and (out.shape is None or out.type is None)
    ]
    # Not for Shape of a value of unknown rank: onnx says [unk], and onnx_shape_inference's Slice
    # of a vector of symbolic length to a huge end (Shape(x)[1:], spelled with INT64_MAX / 2)
    # then "infers" that huge length, which onnxruntime believes.
    if not wanting:
        return False
    try:
        proto, _ = skeleton_proto(model)
        inferred = onnx.shape_inference.infer_shapes(
            proto, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception:  # the other engine is optional help
        logger.debug("onnx.shape_inference failed", exc_info=True)
        return False
    types: dict[str, list[onnx.TypeProto]] = {}
    _proto_types(inferred.graph, types)
    learnt = False
    skips: dict[ir.Graph, Set[ir.Value]] = {}
    for graph, out in wanting:
        found = types.get(str(out.name), [])
        if len(found) != 1 or not found[0].HasField("tensor_type"):
            continue  # unknown, or a name several scopes use: no way to tell which
        if graph not in skips:
            skips[graph] = guessed(graph)
        if out in skips[graph]:
            continue
        tensor_type = found[0].tensor_type
        if out.type is None and tensor_type.elem_type:
            out.dtype = ir.DataType(tensor_type.elem_type)
            changed.add(out)
            learnt = True
        if out.shape is None:
            shape = _shape_of(tensor_type)
            if shape is not None:
                out.shape = shape
                changed.add(out)
                learnt = True
    return learnt
