"""Constant folding of shape arithmetic for the simplifier, in numpy, one node at a time.

Derivative models compute shapes at run time (``Shape`` → ``Gather`` → ``Concat`` →
``Reshape``) where the rules could not see them statically. Once the shapes are annotated, that
arithmetic is constant. :mod:`onnax.passes.fold` folds through the ONNX reference evaluator,
which costs a model build per node: fine for the small expansion models it serves, too slow for
a pass that runs after every transform on graphs of 100k nodes. Here each foldable operator has
a few lines of numpy, and anything these do not cover exactly (float to integer casts, negative
slice steps, integer division of negative numbers, float reductions whose summation order could
differ from onnxruntime's) is left computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.static import static_shape

__all__ = ["MAX_FOLDED_ELEMENTS", "fold_node", "foldable"]

MAX_FOLDED_ELEMENTS = 4096
"""Inputs and results larger than this stay computed: folding is for shapes and small
parameters (a normalisation's per-channel scale, a small weight's transpose), not for data."""

MAX_MATERIALISED_ELEMENTS = 64
"""``Expand`` and ``ConstantOfShape`` make data out of a shape: beyond this, the broadcast stays
(it costs nothing to run, a stored tensor costs its size)."""

Kernel = Callable[[ir.Node, list[np.ndarray | None]], np.ndarray | None]


def _int_list(array: np.ndarray | None) -> list[int] | None:
    return None if array is None else [int(a) for a in np.asarray(array).reshape(-1)]


def _axes(node: ir.Node, args: list[np.ndarray | None], index: int) -> list[int] | None:
    """The ``axes`` of a node: the input at ``index`` (newer opsets) or the attribute."""
    if len(args) > index and args[index] is not None:
        return _int_list(args[index])
    attr = node.attributes.get("axes")
    return None if attr is None else [int(a) for a in attr.as_ints()]


def _shape(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    return static_shape(node)


def _gather(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    data, idx = args
    assert data is not None and idx is not None
    axis = node.attributes.get_int("axis", 0)
    dim = data.shape[axis]
    if np.any(idx < -dim) or np.any(idx >= dim):
        return None
    return np.take(data, idx.astype(np.int64), axis=axis)


def _concat(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    if any(a is None for a in args):
        return None
    return np.concatenate(
        [a for a in args if a is not None], axis=node.attributes.get_int("axis", 0)
    )


def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> Kernel:
    def kernel(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
        (x,) = args
        assert x is not None
        return np.asarray(fn(x))

    return kernel


def _transpose(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    (x,) = args
    assert x is not None
    perm = node.attributes.get("perm")
    return np.transpose(x, None if perm is None else [int(p) for p in perm.as_ints()])


def _unsqueeze(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    x, axes = args[0], _axes(node, args, 1)
    if x is None or axes is None:
        return None
    rank = x.ndim + len(axes)
    return np.expand_dims(x, tuple(sorted(a % rank for a in axes)))


def _squeeze(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    x, axes = args[0], _axes(node, args, 1)
    if x is None:
        return None
    if axes is None:
        return np.squeeze(x)
    if any(x.shape[a] != 1 for a in axes):
        return None
    return np.squeeze(x, tuple(a % x.ndim for a in axes))


def _slice(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    if len(args) < 3 or any(a is None for a in args[:3]):
        return None  # opset < 10 (attributes) or run-time bounds
    x, starts, ends = (np.asarray(a) for a in args[:3])
    axes = _int_list(args[3]) if len(args) > 3 and args[3] is not None else list(range(len(starts)))
    steps = _int_list(args[4]) if len(args) > 4 and args[4] is not None else [1] * len(starts)
    assert axes is not None and steps is not None
    if any(s <= 0 for s in steps):
        # Negative steps clamp ends differently from Python slices; rare in shape arithmetic.
        return None
    index: list[slice] = [slice(None)] * x.ndim
    for a, b, e, s in zip(axes, starts.reshape(-1), ends.reshape(-1), steps, strict=True):
        index[a % x.ndim] = slice(int(b), int(e), s)
    return x[tuple(index)]


_FLOATS = frozenset({ir.DataType.FLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE})
_PLAIN_TYPES = _FLOATS | {
    ir.DataType.BOOL,
    *(getattr(ir.DataType, f"{s}INT{b}") for s in ("", "U") for b in (8, 16, 32, 64)),
}


def _cast(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    (x,) = args
    assert x is not None
    to = ir.DataType(node.attributes.get_int("to", 0))
    if to not in _PLAIN_TYPES or x.dtype.kind not in "biuf":
        return None
    if x.dtype.kind == "f" and to not in _FLOATS:
        return None  # truncation and overflow of a float are the runtime's business
    return x.astype(to.numpy())


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    def kernel(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
        a, b = args
        assert a is not None and b is not None
        if a.dtype != b.dtype:
            return None
        return np.asarray(fn(a, b)).astype(a.dtype, copy=False)

    return kernel


def _compare(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    def kernel(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
        a, b = args
        assert a is not None and b is not None
        return np.asarray(fn(a, b))

    return kernel


def _div(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    a, b = args
    assert a is not None and b is not None
    if a.dtype != b.dtype:
        return None
    if a.dtype.kind in "iu":
        # onnxruntime truncates toward zero, numpy floors: equal only on non-negative operands.
        if np.any(b <= 0) or np.any(a < 0):
            return None
        return (a // b).astype(a.dtype)
    return (a / b).astype(a.dtype)


def _variadic(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    def kernel(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
        if not args or any(a is None or a.dtype != args[0].dtype for a in args):  # type: ignore[union-attr]
            return None
        result = args[0]
        for a in args[1:]:
            result = fn(result, a)  # type: ignore[arg-type]
        return np.asarray(result)

    return kernel


def _reduce(fn: Callable[..., np.ndarray]) -> Kernel:
    def kernel(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
        x = args[0]
        assert x is not None
        if x.dtype.kind not in "iub":
            return None  # a float sum's order is the runtime's
        axes = _axes(node, args, 1)
        keep = bool(node.attributes.get_int("keepdims", 1))
        if not axes:
            if node.attributes.get_int("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.ndim))
        return np.asarray(fn(x, axis=tuple(a % x.ndim for a in axes), keepdims=keep)).astype(
            x.dtype
        )

    return kernel


def _reshape(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    x, shape = args[0], _int_list(args[1]) if len(args) > 1 else None
    if x is None or shape is None:
        return None
    if not node.attributes.get_int("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _range(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    start, limit, delta = args
    assert start is not None and limit is not None and delta is not None
    if start.dtype.kind not in "iu" or int(delta) == 0:
        return None
    return np.arange(int(start), int(limit), int(delta), dtype=start.dtype)


def _constant_of_shape(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    shape = _int_list(args[0])
    assert shape is not None
    if int(np.prod(shape)) > MAX_MATERIALISED_ELEMENTS:
        return None
    attr = node.attributes.get("value")
    fill = attr.as_tensor().numpy().reshape(-1) if attr is not None else np.zeros(1, np.float32)
    return np.full(shape, fill[0], dtype=fill.dtype)


def _expand(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    x, shape = args[0], _int_list(args[1])
    assert x is not None and shape is not None
    out = np.broadcast_shapes(x.shape, tuple(shape))
    if int(np.prod(out)) > MAX_MATERIALISED_ELEMENTS:
        return None
    return np.broadcast_to(x, out).copy()


def _where(node: ir.Node, args: list[np.ndarray | None]) -> np.ndarray | None:
    c, a, b = args
    assert c is not None and a is not None and b is not None
    return np.where(c, a, b).astype(a.dtype) if a.dtype == b.dtype else None


_KERNELS: dict[str, Kernel] = {
    "Identity": lambda node, args: args[0],
    "Shape": _shape,
    "Size": _shape,
    "Gather": _gather,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Cast": _cast,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _div,
    "Neg": _unary(np.negative),
    # Correctly rounded in IEEE arithmetic, so numpy and the runtime agree bit for bit.
    "Sqrt": _unary(np.sqrt),
    "Reciprocal": _unary(np.reciprocal),
    "Transpose": _transpose,
    "Abs": _unary(np.abs),
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Equal": _compare(np.equal),
    "Less": _compare(np.less),
    "Greater": _compare(np.greater),
    "Not": _unary(np.logical_not),
    "And": _compare(np.logical_and),
    "Or": _compare(np.logical_or),
    "Where": _where,
    "ReduceProd": _reduce(np.prod),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
    "Reshape": _reshape,
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
}

# Inputs these operators may leave unknown: the axes of newer opsets are read from the input.
_NEEDS_ONLY_SHAPE = frozenset({"Shape", "Size"})


def foldable(node: ir.Node) -> bool:
    """Whether the simplifier has a kernel for ``node``'s operator."""
    return node.domain == "" and node.op_type in _KERNELS and len(node.outputs) == 1


def fold_node(node: ir.Node, args: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """``node``'s output computed from its known inputs, or None where it is not folded.

    Args:
        node: A node for which :func:`foldable` holds.
        args: The content of each input (None for an omitted one). ``Shape`` and ``Size`` read
            their input's static shape instead and accept None.

    Returns:
        The result (at most :data:`MAX_FOLDED_ELEMENTS` elements), or None when an input is
        unknown, the result would be large or the kernel cannot match the runtime exactly.
    """
    if node.op_type not in _NEEDS_ONLY_SHAPE and any(
        a is None for a, v in zip(args, node.inputs, strict=True) if v is not None
    ):
        return None
    try:
        result = _KERNELS[node.op_type](node, list(args))
    except (ValueError, IndexError, TypeError, OverflowError, ZeroDivisionError):
        # An input the operator would reject at run time: leave the error to the runtime.
        return None
    if result is None or result.size > MAX_FOLDED_ELEMENTS or result.dtype == object:
        return None
    # A copy: a view would keep the input's buffer (a memory-mapped external weight) alive.
    return np.array(result, copy=True)
