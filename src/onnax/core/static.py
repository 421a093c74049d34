"""The static evaluator: values known before the model runs, and nodes computed from them.

Constant folding (:mod:`onnax.passes.fold`), the inlining of Ifs on constant conditions
(:mod:`onnax.passes.inline_if`), shape completion (:mod:`onnax.core.shape_fill`) and the
expansion of operators into their bodies (:mod:`onnax.passes.expand`) all read constants
(:func:`constant_of`) and compute a node's outputs from known inputs the same way: the ONNX
reference implementation (:func:`evaluate`), and ``Shape``/``Size`` read off a static input
shape (:func:`static_shape`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import numpy as np
import onnx
import onnx.helper
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

__all__ = ["array_tensor", "attr_tensor", "constant_of", "evaluate", "static_shape"]


def array_tensor(array: np.ndarray) -> ir.TensorProtocol:
    """``ir.tensor(array)``, without its runtime protocol checks for a numpy array.

    ``ir.tensor`` first tests its argument against ``TensorProtocol``, ``DLPackCompatible``
    and ``ArrayCompatible`` (runtime protocols, which Python 3.11 checks attribute by attribute)
    and then builds ``ir.Tensor(array)`` from a numpy array: a tenth of a millisecond per
    folded value, a few percent of densenet121's vjp. Anything else goes through ``ir.tensor``.
    """
    if type(array) is np.ndarray:
        return ir.Tensor(array)
    return ir.tensor(array)


_TENSOR_CLASSES = frozenset(
    {ir.Tensor, ir.ExternalTensor, ir.StringTensor, ir.LazyTensor, ir.PackedTensor}
    | {ir.TensorProtoTensor}
)
"""onnx_ir's own tensor classes, which ``Attr.as_tensor`` accepts."""


def attr_tensor(attr: ir.Attr) -> ir.TensorProtocol:
    """``attr.as_tensor()``, without its runtime protocol check for onnx_ir's tensor classes.

    ``as_tensor`` checks the value against ``TensorProtocol``, attribute by attribute in
    Python 3.11: a few hundredths of a millisecond per ``Constant``, read at every clone and
    simplification. Values of other classes go through ``as_tensor`` and its check.
    """
    value = attr.value
    if attr.type is ir.AttributeType.TENSOR and type(value) in _TENSOR_CLASSES:
        return value
    return attr.as_tensor()


def constant_of(value: ir.Value | None) -> np.ndarray | None:
    """The value's content when it is an initializer or the output of a ``Constant``."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    node = value.producer()
    if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    for name, attr in node.attributes.items():
        if attr.is_ref():
            return None
        if name == "value":
            return attr_tensor(attr).numpy()
        if name == "value_float":
            return np.array(attr.as_float(), dtype=np.float32)
        if name == "value_floats":
            return np.array(list(attr.as_floats()), dtype=np.float32)
        if name == "value_int":
            return np.array(attr.as_int(), dtype=np.int64)
        if name == "value_ints":
            return np.array(list(attr.as_ints()), dtype=np.int64)
    return None


def static_shape(node: ir.Node) -> np.ndarray | None:
    """``Shape`` (with ``start``/``end``) or ``Size`` of an input whose shape is static."""
    x = node.inputs[0] if node.inputs else None
    if x is None or x.shape is None or not x.shape.is_static():
        return None
    dims = np.array(list(x.shape.numpy()), dtype=np.int64)
    if node.op_type == "Size":
        return np.array(int(np.prod(dims)), dtype=np.int64)
    rank = len(dims)
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    return dims[slice(max(-rank, min(start, rank)), max(-rank, min(end, rank)))]


def evaluate(node: ir.Node, args: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Runs one node through the ONNX reference implementation.

    The few operators that constant folding meets in nearly every model (the ``Add`` and
    ``Sqrt`` of a BatchNormalization's variance and epsilon, the ``Unsqueeze`` of its scale)
    run the very numpy calls of the reference kernels directly (:func:`_numpy_kernel`):
    the reference evaluator's first use imports its two hundred kernel modules, a tenth of
    a second, which was a third of resnet50's vjp and the only thing it needed them for.
    """
    kernel = _numpy_kernel(node, args, opset)
    if kernel is not None:
        try:
            return [np.asarray(kernel())]
        except Exception:  # the reference raises its own error for what numpy refuses
            pass
    names = tuple(f"i{k}" if a is not None else "" for k, a in enumerate(args))
    # serialize_node, not ir.to_proto: to_proto tries the model, graph and node runtime
    # protocols in turn, and those checks cost a millisecond a node (half of a densenet121
    # vjp's constant folding).
    proto = ir.serde.serialize_node(node)
    del proto.input[:]
    proto.input.extend(names)
    del proto.output[:]
    proto.output.extend(f"o{k}" for k in range(len(node.outputs)))
    proto.ClearField("name")  # the name computes nothing: equal nodes share an evaluator
    feeds = {n: a for n, a in zip(names, args, strict=True) if n}
    evaluator = _evaluator(proto.SerializeToString(deterministic=True), names, opset)
    return [np.asarray(r) for r in evaluator.run(None, feeds)]


def _numpy_kernel(
    node: ir.Node, args: list[np.ndarray | None], opset: int
) -> Callable[[], np.ndarray] | None:
    """The reference kernel's own numpy computation for ``node``, where it is that simple.

    Only where the reference evaluator runs exactly this computation and no check of its
    would refuse the inputs (onnx/reference/ops: ``Add`` is ``np.add`` of two arrays of one
    dtype, ``Sqrt`` is ``np.sqrt(x).astype(x.dtype)`` with warnings silenced, ``Unsqueeze``
    from opset 13 is ``np.expand_dims`` over the axes input); None elsewhere.
    """
    if node.domain not in ("", "ai.onnx") or node.attributes.data or len(node.outputs) != 1:
        return None
    # By type, never ``None in args``: that compares arrays with ``==``.
    arrays = [a for a in args if type(a) is np.ndarray]
    if len(arrays) != len(args):
        return None
    op_type = node.op_type
    if op_type == "Add" and len(arrays) == 2:
        x, y = arrays
        if x.dtype == y.dtype and x.dtype.kind in "fiu":
            return lambda: np.add(x, y)
    elif op_type == "Sqrt" and len(arrays) == 1:
        (x,) = arrays
        if x.dtype.kind == "f":
            return lambda: _silent_sqrt(x)
    elif op_type == "Unsqueeze" and opset >= 13 and len(arrays) == 2:
        data, axes = arrays
        if axes.dtype == np.int64 and axes.ndim == 1 and len(axes):
            return lambda: np.expand_dims(data, axis=tuple(axes))
    return None


def _silent_sqrt(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.sqrt(x).astype(x.dtype)


@functools.lru_cache(maxsize=256)
def _evaluator(node: bytes, names: tuple[str, ...], opset: int) -> ReferenceEvaluator:
    """A reference evaluator of the one-node model running ``node`` (a serialised NodeProto).

    Built once per distinct node: a model's folding meets the same node many times (the
    ``Unsqueeze`` of each BatchNormalization's scale to ``[C, 1, 1]``), and building the
    evaluator cost more than running it. The evaluator keeps no state between runs.
    """
    proto = onnx.NodeProto()
    proto.ParseFromString(node)
    outputs = list(proto.output)
    graph = onnx.helper.make_graph(
        [proto],
        "fold",
        [onnx.helper.make_empty_tensor_value_info(n) for n in names if n],
        [onnx.helper.make_empty_tensor_value_info(n) for n in outputs],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=10
    )
    return ReferenceEvaluator(model)
