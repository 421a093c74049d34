"""The rules of :mod:`onnax.core.quick_infer`: per operator, the engine's result, computed as it does.

Each handler copies the logic of one onnx_shape_inference rule (named in :data:`_RULES`) for the
cases where that logic mints no symbol, does no symbolic arithmetic of its own and tracks no
tensor contents, and raises :class:`Unsure` for every other case, which the engine then infers.
A handler reads only final values (:class:`Known`), so what it computes is what the engine's
rule would find in the coming run.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
import onnx_shape_inference as osi

from onnax.core.fast_ir import new_shape

__all__ = [
    "Dim",
    "Known",
    "Result",
    "Unsure",
    "add_rules",
    "data_input",
    "handler",
    "same_dim",
    "shape_contents",
]

Dim = int | ir.SymbolicDim
Result = list[tuple[ir.DataType | None, ir.Shape | None]]
"""Per output of a node, its dtype and shape as the engine's rule sets them."""

_TRACKED = frozenset(
    {
        ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8,
        ir.DataType.UINT64, ir.DataType.UINT32, ir.DataType.UINT16, ir.DataType.UINT8,
    }
)  # fmt: skip
"""Element types whose contents the engine tracks (``get_symbolic_value`` reads constants of
these types): a node reading such data is left to it."""

_SENTINELS = frozenset({2**63 - 1, -(2**63), 2**31 - 1, -(2**31)})
_POSITIVE_SENTINELS = frozenset({2**63 - 1, 2**31 - 1})


class Unsure(Exception):
    """Raised by a handler for a node whose result it does not reproduce exactly."""


class Known:
    """What the handlers may read: the final values, and the contents of ``Shape`` outputs.

    ``contents`` holds, for the output of a ``Shape`` node that the engine infers in the
    coming run (or that :func:`settle` settles as it would), the dimensions the engine will
    track as its contents: its consumers read them, as a target shape, within that run.
    """

    __slots__ = ("contents", "final")

    def __init__(self) -> None:
        self.final: set[ir.Value] = set()
        self.contents: dict[ir.Value, list[Dim]] = {}


def _target(value: ir.Value | None, known: Known) -> list[Dim]:
    """A shape input's contents as the engine reads them: constant, else tracked."""
    if value is not None and value.const_value is None and value in known.contents:
        return known.contents[value]
    return list(_ints(value))


_SUMS: dict[tuple[object, ...], Dim] = {}
"""Symbolic dimension arithmetic done as the engine does it (SymPy), by operands: the engine
computes ``N + 0 + 0`` for a Pad and ``1 * N * 4`` for a Flatten, and the result's spelling is
SymPy's (``4*N``), so it is computed the same way, once per distinct operands."""


def _add(dim: Dim, *terms: int) -> Dim:
    if type(dim) is int:
        return dim + sum(terms)
    assert isinstance(dim, ir.SymbolicDim)
    key = ("+", dim.value, *terms)
    if key not in _SUMS:
        result: object = dim
        for term in terms:
            result = result + term  # type: ignore[operator]
        _SUMS[key] = result  # type: ignore[assignment]
    return _SUMS[key]


def _product(dims: Sequence[Dim]) -> Dim:
    if all(type(d) is int for d in dims):
        return functools.reduce(operator.mul, dims, 1)
    key = ("*", *[d if type(d) is int else str(d.value) for d in dims])  # type: ignore[union-attr]
    if key not in _SUMS:
        _SUMS[key] = functools.reduce(operator.mul, dims, 1)
    return _SUMS[key]


def _data(value: ir.Value | None, known: Known) -> ir.Value:
    """A data input of known tensor type and shape that the engine leaves as it is."""
    if value is None or value not in known.final:
        raise Unsure
    dtype = value.dtype
    if dtype is None or dtype in _TRACKED or value.shape is None:
        raise Unsure
    return value


data_input = _data
"""For the rules of other modules (:mod:`onnax.core.quick_conv`)."""


def _ints(value: ir.Value | None) -> list[int]:
    """The contents of a constant 0-d or 1-d integer input, as the engine reads them."""
    if value is None:
        raise Unsure
    tensor = value.const_value
    if tensor is None or value.dtype not in _TRACKED or len(tensor.shape) > 1:
        raise Unsure
    # tolist() gives Python ints for the integer types tracked, as int() of each element.
    return np.asarray(tensor.numpy()).reshape(-1).tolist()


def same_dim(a: Dim, b: Dim) -> bool:
    """Whether two dimensions are the same number or the same named symbol (exact types)."""
    if type(a) is int or type(b) is int:
        return type(a) is type(b) and a == b
    assert isinstance(a, ir.SymbolicDim) and isinstance(b, ir.SymbolicDim)
    return a.value is not None and a.value == b.value


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise Unsure  # the engine reports an error
    return axis + rank if axis < 0 else axis


# ------------------------------------------------------------------------------ rules
def _unary(node: ir.Node, known: Known) -> Result:
    """``infer_unary`` and kin: the input's shape object and dtype."""
    x = _data(node.inputs[0] if node.inputs else None, known)
    if not isinstance(x.type, ir.TensorType):
        raise Unsure  # Identity of a sequence sets the type instead
    return [(x.dtype, x.shape)]


def _cast(node: ir.Node, known: Known) -> Result:
    x = _data(node.inputs[0] if node.inputs else None, known)
    to = node.attributes.get("to")
    if to is None or to.type != ir.AttributeType.INT:
        raise Unsure
    return [(ir.DataType(to.as_int()), x.shape)]


def _broadcast_dim(d1: Dim, d2: Dim) -> Dim:
    """``_broadcast._broadcast_dim`` for numbers and named symbols, without its guesses."""
    if type(d1) is int and type(d2) is int:
        if d1 == d2 or d2 == 1:
            return d1
        if d1 == 1:
            return d2
        raise Unsure  # the engine gives no shape at all
    if type(d1) is int:
        return d2 if d1 == 1 else d1  # a number other than 1 wins over a symbol
    if type(d2) is int:
        return d1 if d2 == 1 else d2
    assert isinstance(d1, ir.SymbolicDim) and isinstance(d2, ir.SymbolicDim)
    if d1.value is None or d1.value != d2.value:
        raise Unsure  # equal expressions spelled differently, or a guess
    return d1


def _broadcast(a: ir.Shape, b: ir.Shape) -> ir.Shape:
    da, db = a.dims, b.dims
    if da == db:  # tuples, compared element by element (mostly by identity)
        for d in da:  # a loop: most nodes settled are elementwise
            if not isinstance(d, int) and d.value is None:
                raise Unsure
        return new_shape(list(da))
    rank = max(len(da), len(db))
    pa = (1,) * (rank - len(da)) + da
    pb = (1,) * (rank - len(db)) + db
    return new_shape([_broadcast_dim(x, y) for x, y in zip(pa, pb, strict=True)])


def _binary(node: ir.Node, known: Known) -> Result:
    """``infer_binary_elementwise``: the broadcast shape, the first input's dtype."""
    if len(node.inputs) != 2:
        raise Unsure
    a, b = _data(node.inputs[0], known), _data(node.inputs[1], known)
    assert a.shape is not None and b.shape is not None
    return [(a.dtype, _broadcast(a.shape, b.shape))]


def _matmul(node: ir.Node, known: Known) -> Result:
    """``_matmul_shape`` for inputs of rank 2 or more whose batch dimensions agree."""
    if len(node.inputs) != 2:
        raise Unsure
    a, b = _data(node.inputs[0], known), _data(node.inputs[1], known)
    assert a.shape is not None and b.shape is not None
    da, db = a.shape.dims, b.shape.dims
    if len(da) < 2 or len(db) < 2:
        raise Unsure
    ka, kb = da[-1], db[-2]
    if type(ka) is int and type(kb) is int and ka != kb:
        raise Unsure  # an error
    batch = _broadcast(new_shape(list(da[:-2])), new_shape(list(db[:-2])))
    for x, y in zip(
        (1,) * (len(batch) - len(da) + 2) + da[:-2],
        (1,) * (len(batch) - len(db) + 2) + db[:-2],
        strict=True,
    ):
        if type(x) is not int and type(y) is not int and not same_dim(x, y):
            raise Unsure  # the engine mints a symbol
    return [(a.dtype, new_shape([*batch.dims, da[-2], db[-1]]))]


def _gemm(node: ir.Node, known: Known) -> Result:
    a, b = _data(node.inputs[0], known), _data(node.inputs[1], known)
    assert a.shape is not None and b.shape is not None
    if a.shape.rank() != 2 or b.shape.rank() != 2:
        raise Unsure
    trans_a = node.attributes.get_int("transA", 0)
    trans_b = node.attributes.get_int("transB", 0)
    da, db = a.shape.dims, b.shape.dims
    ka, kb = (da[0] if trans_a else da[1]), (db[1] if trans_b else db[0])
    if type(ka) is int and type(kb) is int and ka != kb:
        raise Unsure
    return [(a.dtype, ir.Shape([da[1] if trans_a else da[0], db[0] if trans_b else db[1]]))]


def _transpose(node: ir.Node, known: Known) -> Result:
    x = _data(node.inputs[0], known)
    assert x.shape is not None
    rank = x.shape.rank()
    perm_attr = node.attributes.get("perm")
    perm = list(perm_attr.as_ints()) if perm_attr is not None else list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        raise Unsure
    dims = x.shape.dims
    return [(x.dtype, new_shape([dims[i] for i in perm]))]


def _reshape(node: ir.Node, known: Known) -> Result:
    """``infer_reshape`` to a constant shape, the ``-1`` computed from numbers only."""
    if len(node.inputs) != 2:
        raise Unsure
    x = _data(node.inputs[0], known)
    assert x.shape is not None
    target = _target(node.inputs[1], known)
    allowzero = node.attributes.get_int("allowzero", 0)
    dims: list[Dim] = []
    inferred = None
    for i, d in enumerate(target):
        if type(d) is not int:
            dims.append(d)  # a tracked dimension, as it is
        elif d == 0 and not allowzero:
            if i >= x.shape.rank():
                raise Unsure  # a fresh symbol
            dims.append(x.shape.dims[i])
        elif d < -1:
            raise Unsure  # an error
        elif d == -1:
            if inferred is not None:
                raise Unsure
            inferred = i
            dims.append(-1)
        else:
            dims.append(d)
    if inferred is not None:
        others = [d for i, d in enumerate(dims) if i != inferred]
        if not all(type(d) is int and d > 0 for d in others):
            raise Unsure
        numbers = [d for d in x.shape.dims if isinstance(d, int)]
        if len(numbers) < x.shape.rank():
            raise Unsure  # a symbolic quotient
        dims[inferred] = _product(numbers) // _product(others)  # type: ignore[operator]
    return [(x.dtype, new_shape(dims))]


def _reduce(node: ir.Node, known: Known) -> Result:
    """``infer_reduce`` over axes from a constant input or the attribute."""
    x = _data(node.inputs[0] if node.inputs else None, known)
    assert x.shape is not None
    keepdims = node.attributes.get_int("keepdims", 1)
    noop = node.attributes.get_int("noop_with_empty_axes", 0)
    if len(node.inputs) >= 2 and node.inputs[1] is not None:
        axes = _ints(node.inputs[1])
    else:
        attr = node.attributes.get("axes")
        axes = list(attr.as_ints()) if attr is not None else []
    rank = x.shape.rank()
    if not axes and noop:
        return [(x.dtype, x.shape)]
    reduced = set(range(rank)) if not axes else {_axis(a, rank) for a in axes}
    dims: list[Dim] = []
    for i, d in enumerate(x.shape.dims):
        if i not in reduced:
            dims.append(d)
        elif keepdims:
            dims.append(1)
    return [(x.dtype, new_shape(dims))]


def _concat(node: ir.Node, known: Known) -> Result:
    """``infer_concat`` when the dimensions along the axis are numbers."""
    if not node.inputs:
        raise Unsure
    values = [_data(v, known) for v in node.inputs]
    shapes = [v.shape for v in values]
    attr = node.attributes.get("axis")
    if attr is None:
        raise Unsure
    rank = shapes[0].rank() if shapes[0] is not None else 0
    axis = attr.as_int()
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or any(s is None or s.rank() != rank for s in shapes):
        raise Unsure
    if rank == 1:
        raise Unsure  # the engine tracks a vector's contents, with fresh symbols
    along = [s.dims[axis] for s in shapes if s is not None]
    if not all(type(d) is int for d in along):
        raise Unsure  # a symbolic sum
    dims = list(shapes[0].dims) if shapes[0] is not None else []
    dims[axis] = sum(d for d in along if isinstance(d, int))
    return [(values[0].dtype, new_shape(dims))]


def _slice(node: ir.Node, known: Known) -> Result:
    """``infer_slice`` with constant bounds, on the branches that mint nothing."""
    if len(node.inputs) < 3:
        raise Unsure
    x = _data(node.inputs[0], known)
    assert x.shape is not None
    starts, ends = _ints(node.inputs[1]), _ints(node.inputs[2])
    axes = _ints(node.inputs[3]) if len(node.inputs) >= 4 and node.inputs[3] is not None else None
    steps = _ints(node.inputs[4]) if len(node.inputs) >= 5 and node.inputs[4] is not None else None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Unsure
    rank = x.shape.rank()
    dims: list[Dim] = list(x.shape.dims)
    for start, end_value, axis, step in zip(starts, ends, axes, steps, strict=True):
        if axis < 0:
            axis += rank
        if not 0 <= axis < rank:
            continue
        dim = x.shape.dims[axis]
        if step == 0:
            raise Unsure
        end: Dim = end_value
        if step > 0 and end_value in _POSITIVE_SENTINELS:
            end = dim
        if (start == 0 and step == 1 and type(end) is int and end in _SENTINELS) or (
            step == -1 and start in _SENTINELS and end in _SENTINELS
        ):
            dims[axis] = dim
        elif type(dim) is int and type(end) is int:
            if step > 0:
                lo = max(0, min(start if start >= 0 else start + dim, dim))
                hi = max(0, min(end if end >= 0 else end + dim, dim))
            else:
                lo = max(-1, min(start if start >= 0 else start + dim, dim - 1))
                hi = max(-1, min(end if end >= 0 else end + dim, dim - 1))
            dims[axis] = max(0, (hi - lo + (step - (1 if step > 0 else -1))) // step)
        elif step > 0 and start >= 0 and type(end) is int and end >= 0:
            dims[axis] = max(0, (end - start + step - 1) // step)
        else:
            raise Unsure  # symbolic arithmetic or a fresh symbol
    return [(x.dtype, new_shape(dims))]


def _layer_norm(node: ir.Node, known: Known) -> Result:
    """``infer_layer_normalization``: ``X``'s shape; the statistics ``X.shape[:axis]`` + 1s."""
    if len(node.inputs) < 2 or node.inputs[1] is None or not 1 <= len(node.outputs) <= 3:
        raise Unsure
    x = _data(node.inputs[0], known)
    assert x.shape is not None
    result: Result = [(x.dtype, x.shape)]
    if len(node.outputs) > 1:
        rank = x.shape.rank()
        axis = _axis(node.attributes.get_int("axis", -1), rank)
        stash = ir.DataType(node.attributes.get_int("stash_type", 1))
        reduced = new_shape([*x.shape.dims[:axis], *([1] * (rank - axis))])
        result += [(stash, reduced)] * (len(node.outputs) - 1)
    return result


def _expand(node: ir.Node, known: Known) -> Result:
    """``infer_expand``: the input broadcast with a constant or tracked target shape."""
    if len(node.inputs) != 2:
        raise Unsure
    x = _data(node.inputs[0], known)
    assert x.shape is not None
    target = ir.Shape(_target(node.inputs[1], known))
    return [(x.dtype, _broadcast(x.shape, target))]


def _pad(node: ir.Node, known: Known) -> Result:
    """``infer_pad_v11`` with constant pads (and axes)."""
    if len(node.inputs) < 2:
        raise Unsure
    x = _data(node.inputs[0], known)
    assert x.shape is not None
    pads = _ints(node.inputs[1])
    dims = list(x.shape.dims)
    rank = len(dims)
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        axes = _ints(node.inputs[3])
        n = len(axes)
        for i, axis in enumerate(axes):
            axis = axis + rank if axis < 0 else axis
            dims[axis] = _add(x.shape.dims[axis], pads[i], pads[i + n])
    else:
        if len(pads) < 2 * rank:
            raise Unsure
        dims = [_add(d, pads[i], pads[i + rank]) for i, d in enumerate(dims)]
    return [(x.dtype, ir.Shape(dims))]


def _flatten(node: ir.Node, known: Known) -> Result:
    """``infer_flatten``: the products of the dimensions before and from the axis."""
    x = _data(node.inputs[0] if node.inputs else None, known)
    assert x.shape is not None
    rank = x.shape.rank()
    axis = node.attributes.get_int("axis", 1)
    if not -rank <= axis <= rank:
        raise Unsure
    axis = axis + rank if axis < 0 else axis
    dims = x.shape.dims
    return [(x.dtype, ir.Shape([_product(dims[:axis]), _product(dims[axis:])]))]


def shape_contents(node: ir.Node, known: Known) -> list[Dim] | None:
    """What ``infer_shape`` tracks as the contents of a ``Shape`` of a final value."""
    x = node.inputs[0] if len(node.inputs) == 1 else None
    if x is None or x not in known.final or x.shape is None or len(node.outputs) != 1:
        return None
    rank = x.shape.rank()
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    start = max(0, min(start + rank if start < 0 else start, rank))
    end = max(0, min(end + rank if end < 0 else end, rank))
    return list(x.shape.dims[start:end])


def _squeeze_axes(node: ir.Node) -> list[int]:
    """The axes of a ``Squeeze`` or ``Unsqueeze``, constant input or attribute, if given."""
    if len(node.inputs) >= 2 and node.inputs[1] is not None:
        return _ints(node.inputs[1])
    attr = node.attributes.get("axes")
    if attr is None:
        raise Unsure  # a Squeeze of every 1, which is a guess for symbols
    return list(attr.as_ints())


def _unsqueeze(node: ir.Node, known: Known) -> Result:
    """``infer_unsqueeze``: 1s inserted at the (output's) axes."""
    x = _data(node.inputs[0] if node.inputs else None, known)
    assert x.shape is not None
    axes = _squeeze_axes(node)
    rank = x.shape.rank() + len(axes)
    normalized = sorted(_axis(a, rank) for a in axes)
    if len(set(normalized)) != len(axes):
        raise Unsure
    dims: list[Dim] = list(x.shape.dims)
    for a in normalized:
        dims.insert(a, 1)
    return [(x.dtype, new_shape(dims))]


def _squeeze(node: ir.Node, known: Known) -> Result:
    """``infer_squeeze`` with axes, each of dimension 1 or a symbol."""
    x = _data(node.inputs[0] if node.inputs else None, known)
    assert x.shape is not None
    axes = _squeeze_axes(node)
    rank = x.shape.rank()
    normalized = {_axis(a, rank) for a in axes}
    dims = x.shape.dims
    if len(normalized) != len(axes) or any(
        isinstance(dims[a], int) and dims[a] != 1 for a in normalized
    ):
        raise Unsure
    return [(x.dtype, new_shape([d for i, d in enumerate(dims) if i not in normalized]))]


_Handler = Callable[[ir.Node, Known], Result]

_UNARY_OPS = [
    "Abs",
    "Acos",
    "Acosh",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "Cos",
    "Cosh",
    "Elu",
    "Erf",
    "Exp",
    "Gelu",
    "HardSigmoid",
    "LeakyRelu",
    "Log",
    "Reciprocal",
    "Relu",
    "Selu",
    "Sigmoid",
    "Sin",
    "Sinh",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Tan",
    "Tanh",
]

_RULES: dict[str, tuple[str, _Handler]] = {
    **{op: ("_unary.infer_unary", _unary) for op in _UNARY_OPS},
    "Neg": ("_unary._infer_unary_with_value", _unary),
    "Identity": ("_unary.infer_identity", _unary),
    "Cast": ("_cast.infer_cast", _cast),
    **{op: ("_elementwise._infer_arithmetic", _binary) for op in ("Add", "Sub", "Mul", "Div")},
    "MatMul": ("_matmul.infer_matmul", _matmul),
    "Gemm": ("_gemm.infer_gemm", _gemm),
    "Transpose": ("_transpose.infer_transpose", _transpose),
    "Reshape": ("_reshape.infer_reshape", _reshape),
    **{
        op: ("_reduce.infer_reduce", _reduce)
        for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare")
    },
    "Concat": ("_concat.infer_concat", _concat),
    "Slice": ("_slice.infer_slice", _slice),
    "LayerNormalization": ("_normalization.infer_layer_normalization", _layer_norm),
    "Expand": ("_expand.infer_expand", _expand),
    "Pad": ("_pad.infer_pad_v11", _pad),
    "Flatten": ("_shape_ops.infer_flatten", _flatten),
    "Unsqueeze": ("_squeeze.infer_unsqueeze", _unsqueeze),
    "Squeeze": ("_squeeze.infer_squeeze", _squeeze),
    "Shape": ("_shape_ops.infer_shape", _unary),  # by settle itself (shape_contents)
}
"""Per operator, the engine rule mimicked (module under ``onnx_shape_inference._ops`` and
function name) and the handler mimicking it."""

_HANDLERS: dict[tuple[str, int], _Handler | None] = {}
"""Per operator and opset, the handler, or None where the engine's rule is not the one mimicked."""


def add_rules(rules: dict[str, tuple[str, _Handler]]) -> None:
    """Adds the rules of another module (:mod:`onnax.core.quick_conv`), which builds on these."""
    _RULES.update(rules)
    _HANDLERS.clear()


def handler(op_type: str, opset: int) -> _Handler | None:
    """The handler of an operator at an opset, if the engine's rule there is the one it copies."""
    key = (op_type, opset)
    if key not in _HANDLERS:
        handler = None
        if op_type in _RULES:
            expected, candidate = _RULES[op_type]
            osi.registry.collect()
            func = osi.registry.get("", op_type, version=opset)
            if func is not None and f"{func.__module__}.{func.__name__}" == (
                f"onnx_shape_inference._ops.{expected}"
            ):
                handler = candidate
        _HANDLERS[key] = handler
    return _HANDLERS[key]
