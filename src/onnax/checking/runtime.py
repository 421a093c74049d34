"""Running models for the check: onnxruntime first, ``onnx.reference`` where it lacks a kernel.

The reference side of the check prefers a *float64 twin* of the source: the same graph with every
FLOAT/FLOAT16/BFLOAT16 type, tensor and dtype attribute in DOUBLE. Central differences of the
twin are accurate to many digits with steps small enough to stay clear of most kinks, where a
float32 difference needs a step so large (3e-3) that it crosses them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx_ir as ir

__all__ = ["Runner", "float64_twin", "has_external_data", "runner"]

Feeds = Mapping[str, np.ndarray]
Runner = Callable[[Feeds], dict[str, np.ndarray]]

_NARROW = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
_DTYPE_ATTRS = frozenset({"to", "dtype", "output_dtype"})


def has_external_data(model: ir.Model) -> bool:
    """Whether an initializer of ``model`` keeps its data in an external file."""
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


def _to_proto_bytes(model: ir.Model, folder: str) -> str | bytes:
    # From bytes, onnxruntime resolves external references against the working directory: a
    # model with external weights is saved with its own data file and opened by path instead.
    if has_external_data(model):
        path = str(Path(folder) / "model.onnx")
        ir.save(model, path, external_data="model.onnx.data")
        return path
    return ir.to_proto(model).SerializeToString()


def _onnxruntime(model: ir.Model) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # a missing kernel is reported by the fallback, not logged
    with tempfile.TemporaryDirectory() as folder:
        sess = ort.InferenceSession(
            _to_proto_bytes(model, folder), options, providers=["CPUExecutionProvider"]
        )
    names = [o.name for o in sess.get_outputs()]
    wanted = [i.name for i in sess.get_inputs()]

    def run(feeds: Feeds) -> dict[str, np.ndarray]:
        return dict(zip(names, sess.run(None, {k: feeds[k] for k in wanted}), strict=True))

    return run


def _reference(model: ir.Model) -> Runner:
    from onnx.reference import ReferenceEvaluator

    proto = ir.to_proto(model)
    if has_external_data(model):
        import onnx

        with tempfile.TemporaryDirectory() as folder:
            ir.save(model, str(Path(folder) / "m.onnx"), external_data="m.onnx.data")
            proto = onnx.load(str(Path(folder) / "m.onnx"))
    evaluator = ReferenceEvaluator(proto)
    names = [o.name for o in proto.graph.output]
    wanted = [
        i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}
    ]

    def run(feeds: Feeds) -> dict[str, np.ndarray]:
        outs = evaluator.run(None, {k: feeds[k] for k in wanted})
        return {n: np.asarray(o) for n, o in zip(names, outs, strict=True)}

    return run


class _Backend:
    """The runtime a runner uses; it can change on the first run (see :func:`runner`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fallback: Runner | None = None

    def __str__(self) -> str:
        return self.name


def runner(model: ir.Model) -> tuple[Runner, _Backend]:
    """A function running ``model``, and the name of the runtime behind it.

    onnxruntime when it can build a session and run it; otherwise ``onnx.reference`` (slower,
    with a kernel for most standard operators and types, float64 ``Erf`` among them).
    onnxruntime reports some missing kernels only when it runs (float64 ``GRU``), so the
    first run decides too. When both fail, the onnxruntime error is raised, chained to the
    reference evaluator's.
    """
    try:
        ort_run = _onnxruntime(model)
    except Exception as ort_error:
        try:
            return _reference(model), _Backend("onnx.reference")
        except Exception as ref_error:
            raise ort_error from ref_error
    backend = _Backend("onnxruntime")

    def run(feeds: Feeds) -> dict[str, np.ndarray]:
        if backend.fallback is not None:
            return backend.fallback(feeds)
        try:
            return ort_run(feeds)
        except Exception as ort_error:
            try:
                backend.fallback = _reference(model)
                backend.name = "onnx.reference (onnxruntime failed to run it)"
                return backend.fallback(feeds)
            except Exception as ref_error:
                raise ort_error from ref_error

    return run, backend


def _double(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    if tensor.dtype not in _NARROW:
        return tensor
    return ir.tensor(tensor.numpy().astype(np.float64), name=tensor.name)


def float64_twin(model: ir.Model) -> ir.Model:
    """A copy of ``model`` computing in float64 wherever it computed in a narrower float type.

    Graph inputs, outputs, initializers and node outputs of every graph, tensor attributes
    (``Constant``, ``ConstantOfShape``) and the dtype attributes ``to``/``dtype``/``output_dtype``
    (``Cast``, ``EyeLike``, ``RandomNormal``...) all become DOUBLE.
    """
    copy = model.clone()
    for graph in copy.graphs():
        values = [
            *graph.inputs,
            *graph.initializers.values(),
            *(o for n in graph for o in n.outputs),
        ]
        for v in values:
            if v.dtype in _NARROW and isinstance(v.type, ir.TensorType):
                # A new type object: the dtype setter would edit one the source may share.
                v.type = ir.TensorType(ir.DataType.DOUBLE)
            if v.const_value is not None:
                v.const_value = _double(v.const_value)
        for node in graph:
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR:
                    node.attributes[name] = ir.AttrTensor(name, _double(attr.as_tensor()))
                elif (
                    attr.type == ir.AttributeType.INT
                    and name in _DTYPE_ATTRS
                    and attr.as_int() in _NARROW
                ):
                    node.attributes[name] = ir.AttrInt64(name, ir.DataType.DOUBLE)
    return copy
