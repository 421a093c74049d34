"""The quick inference (:mod:`onnax.core.quick_infer`) changes nothing that inference finds.

The oracle is the same inference with the quick inference turned off (every node inferred by
onnx_shape_inference): each value's type, dimensions (numbers and symbol names), constant and
metadata (the engine's record of tracked contents) must be equal, field by field, on every
model of ``tests/data``, once from scratch and once again after clearing some outputs (the
second inference of a transform, passing over the recorded nodes), and on random graphs of the
operators it handles, with symbolic and broadcast dimensions, constant and ``Shape``-computed
targets, and some outputs holding a partial shape beforehand.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
from onnx_shape_inference import infer_symbolic_shapes

import onnax.core.inference as inference
import onnax.core.quick_infer as quick_infer
from onnax.core.inference import infer_shapes

DATA = pathlib.Path(__file__).parent.parent / "data"
MODELS = sorted(DATA.rglob("*.onnx"))

Snapshot = dict[str, tuple[Any, ...]]


def _values(graph: ir.Graph) -> Iterator[ir.Value]:
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in graph:
        yield from node.outputs
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from _values(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    yield from _values(sub)


def _snapshot(model: ir.Model) -> Snapshot:
    """Every value's type, dimensions, constant and metadata, by name (and position)."""
    found: Snapshot = {}
    for i, v in enumerate(_values(model.graph)):
        shape = v.shape
        tensor = v.const_value
        found[f"{i}:{v.name}"] = (
            type(v.type).__name__,
            v.dtype,
            None if shape is None else tuple(d if isinstance(d, int) else d.value for d in shape),
            None
            if tensor is None
            else tensor.name  # initializers: not read
            if isinstance(tensor, ir.ExternalTensor)
            else (tensor.dtype, tensor.numpy().tobytes()),
            dict(v.metadata_props),
        )
    return found


def _without_quick(monkeypatch: pytest.MonkeyPatch, run: Callable[[], None]) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(inference, "settle", lambda model, skipped: [])
        patch.setattr(inference, "engine_idle", lambda model, known: False)
        run()


def _copy(model: ir.Model) -> ir.Model:
    return model.clone()  # keeps external tensors readable (a proto round trip loses their folder)


def _compare(
    model: ir.Model, monkeypatch: pytest.MonkeyPatch, infer: Callable[[ir.Model], None]
) -> None:
    quick, oracle = _copy(model), _copy(model)
    infer(quick)
    _without_quick(monkeypatch, lambda: infer(oracle))
    assert _snapshot(quick) == _snapshot(oracle)


def _clear_some(model: ir.Model, seed: int) -> None:
    """Clears the type and shape of about a third of the node outputs, as new nodes have."""
    rng = np.random.default_rng(seed)
    for node in model.graph:
        for out in node.outputs:
            if not out.is_graph_output() and rng.random() < 0.33:
                out.shape = None
                out.type = None
                out.const_value = None


@pytest.mark.parametrize("path", MODELS, ids=[str(p.relative_to(DATA)) for p in MODELS])
def test_models_infer_the_same(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = ir.load(path)
    _compare(model, monkeypatch, infer_shapes)

    def twice(m: ir.Model) -> None:
        infer_shapes(m, record=True)
        _clear_some(m, seed=len(path.name))
        infer_shapes(m, new_only=True)

    _compare(model, monkeypatch, twice)


def _settled_share(model: ir.Model) -> float:
    """The share of nodes :func:`quick_infer.settle` settles in a model without inferred shapes."""
    for node in model.graph:
        for out in node.outputs:
            if not out.is_graph_output():
                out.shape = None
                out.type = None
    settled = quick_infer.settle(model, set(inference._settled_constants(model)))
    return len(settled) / len(model.graph)


@pytest.mark.parametrize(
    "name", ["torch_mlp.onnx", "torch_sdpa.onnx", "torch_spatial_transformer.onnx"]
)
def test_it_settles_most_nodes(name: str) -> None:
    """The comparisons are not vacuous: these models' nodes are mostly settled (others, from
    TorchScript, start from integer shape arithmetic or a convolution, which the engine infers)."""
    assert _settled_share(ir.load(DATA / name)) >= 0.6


# ------------------------------------------------------------------------ random graphs
SYMBOLS = ["N", "M"]


class _Builder:
    """Grows a random graph of the quick inference's operators, valid by construction."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        rank = int(rng.integers(1, 5))
        dims: list[int | str] = [self._dim() for _ in range(rank)]
        x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(dims))
        self.graph = ir.Graph([x], [], nodes=[], opset_imports={"": 21}, name="g")
        self.model = ir.Model(self.graph, ir_version=10)
        self.floats: list[ir.Value] = [x]
        self.count = 0

    def _dim(self) -> int | str:
        return (
            str(self.rng.choice(SYMBOLS))
            if self.rng.random() < 0.3
            else int(self.rng.choice([1, 2, 3, 4]))
        )

    def _name(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def const(self, array: np.ndarray) -> ir.Value:
        name = self._name()
        value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        value.type = ir.TensorType(ir.DataType.from_numpy(array.dtype))
        value.shape = ir.Shape(array.shape)
        self.graph.register_initializer(value)
        return value

    def op(
        self, op_type: str, inputs: list[ir.Value | None], outputs: int = 1, **attrs: Any
    ) -> list[ir.Value]:
        node = ir.node(op_type, inputs, attributes=attrs, num_outputs=outputs)
        for out in node.outputs:
            out.name = self._name()
        self.graph.append(node)
        # Inferred at once, so that the next node's parameters can fit its inputs.
        infer_symbolic_shapes(self.model, warn_on_missing=False)
        return list(node.outputs)

    def pick(self) -> ir.Value:
        known = [v for v in self.floats if v.shape is not None and v.dtype is not None]
        return known[int(self.rng.integers(len(known)))]

    def step(self) -> None:
        rng = self.rng
        x = self.pick()
        assert x.shape is not None
        dims = list(x.shape.dims)
        rank = len(dims)
        kind = int(rng.integers(16 if rank else 4))  # a scalar: elementwise operators only
        made: list[ir.Value] = []
        if kind == 0:
            made = self.op(str(rng.choice(["Tanh", "Exp", "Neg", "Identity", "Erf"])), [x])
        elif kind == 1:
            made = self.op("Cast", [x], to=int(rng.choice([1, 11, 10])))
            if made[0].dtype == ir.DataType.FLOAT16:
                made = []  # kept out of the float pool: Pad of it is fine, the point is the types
        elif kind == 2:
            other = self.pick() if rng.random() < 0.5 else x
            if other.shape is not None and other.dtype == x.dtype:
                made = self.op(str(rng.choice(["Add", "Sub", "Mul", "Div"])), [x, other])
        elif kind == 3:
            tail = [1 if rng.random() < 0.4 else d for d in dims[int(rng.integers(rank + 1)) :]]
            if all(isinstance(d, int) for d in tail):
                bias = self.const(np.ones(tail, np.float32))
                made = self.op("Add", [bias, x] if rng.random() < 0.5 else [x, bias])
        elif kind == 4 and rank >= 2 and isinstance(dims[-1], int):
            w = self.const(np.ones((dims[-1], int(rng.integers(1, 4))), np.float32))
            made = self.op("MatMul", [x, w])
        elif kind == 5:
            made = self.op("Transpose", [x], perm=[int(i) for i in rng.permutation(rank)])
        elif kind == 6:
            made = self._reshape(x, dims)
        elif kind == 7:
            axes = sorted({int(a) - rank for a in rng.integers(0, rank, size=2)})
            made = self.op(
                str(rng.choice(["ReduceSum", "ReduceMean", "ReduceMax"])),
                [x, self.const(np.array(axes, np.int64))],
                keepdims=int(rng.integers(2)),
            )
        elif kind == 8:
            axis = int(rng.integers(rank))
            made = self.op("Concat", [x, x], axis=axis - rank if rng.random() < 0.5 else axis)
        elif kind == 9:
            made = self._slice(x, rank)
        elif kind == 10:
            pads = [
                0 if not isinstance(d, int) and rng.random() < 0.8 else int(rng.integers(0, 3))
                for d in dims * 2
            ]
            made = self.op("Pad", [x, self.const(np.array(pads, np.int64))])
        elif kind == 11:
            target = [d if rng.random() < 0.5 else 1 for d in dims]
            if rng.random() < 0.5 and all(isinstance(d, int) for d in target):
                made = self.op("Expand", [x, self.const(np.array(target, np.int64))])
            else:
                (shape,) = self.op("Shape", [self.pick()])
                made = self.op("Expand", [x, shape])
        elif kind == 12:
            made = self.op("Flatten", [x], axis=int(rng.integers(-rank, rank + 1)))
        elif kind == 13 and isinstance(dims[-1], int):
            scale = self.const(np.ones(dims[-1], np.float32))
            made = self.op(
                "LayerNormalization", [x, scale], outputs=int(rng.choice([1, 3])), axis=-1
            )
        elif kind == 14 and rank == 2 and isinstance(dims[1], int):
            w = self.const(np.ones((int(rng.integers(1, 4)), dims[1]), np.float32))
            made = self.op("Gemm", [x, w], transB=1)
        elif kind == 15:
            (shape,) = self.op("Shape", [x], start=int(rng.integers(-rank, 1)))
            made = self.op("Reshape", [self.pick(), shape]) if rng.random() < 0.3 else []
        self.floats.extend(v for v in made if v.dtype is not None)

    def _reshape(self, x: ir.Value, dims: list[int | ir.SymbolicDim]) -> list[ir.Value]:
        rng = self.rng
        if rng.random() < 0.4:
            (shape,) = self.op("Shape", [x])
            return self.op("Reshape", [x, shape])
        static = [d for d in dims if isinstance(d, int)]
        target: list[int] = [0 if not isinstance(d, int) else d for d in dims]
        if len(static) == len(dims):
            target = [int(np.prod(static, dtype=np.int64))] if rng.random() < 0.5 else [-1]
            if rng.random() < 0.5:
                target = [1, *target]
        elif rng.random() < 0.5:
            target = [*target, 1]
        return self.op("Reshape", [x, self.const(np.array(target, np.int64))])

    def _slice(self, x: ir.Value, rank: int) -> list[ir.Value]:
        rng = self.rng
        axis = int(rng.integers(rank))
        start = int(rng.choice([0, 1, -1, -3]))
        end = int(rng.choice([2**63 - 1, 2, 3, -1, -(2**63)]))
        step = int(rng.choice([1, 1, 2, -1]))
        return self.op(
            "Slice",
            [
                x,
                self.const(np.array([start], np.int64)),
                self.const(np.array([end], np.int64)),
                self.const(np.array([axis - rank if rng.random() < 0.5 else axis], np.int64)),
                self.const(np.array([step], np.int64)),
            ],
        )


def _random_model(seed: int) -> ir.Model:
    rng = np.random.default_rng(seed)
    builder = _Builder(rng)
    for _ in range(int(rng.integers(8, 25))):
        builder.step()
    graph = builder.graph
    last = graph[-1].outputs[0]
    graph.outputs.append(last)
    for node in graph:
        for out in node.outputs:
            if out.is_graph_output():
                continue
            if rng.random() < 0.15 and out.shape is not None:
                # A partial shape, as a transform's emitted value or a forgotten broadcast has.
                out.shape = ir.Shape([ir.SymbolicDim(None) for _ in out.shape.dims])
            else:
                out.shape = None
                out.type = None
            out.const_value = None
            out.metadata_props.clear()
    return builder.model


@pytest.mark.parametrize("seed", range(60))
def test_random_graphs_infer_the_same(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _random_model(seed)
    assert _settled_share(model.clone()) > 0 or len(model.graph) < 12  # not vacuous
    _compare(model, monkeypatch, infer_shapes)
    _compare(model, monkeypatch, lambda m: infer_shapes(m, complete=False))
