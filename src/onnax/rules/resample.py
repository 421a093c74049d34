"""Resampling and the determinant: DepthToSpace, SpaceToDepth, Resize (nearest), Det.

DepthToSpace and SpaceToDepth only move elements, so they are linear: the tangent is the same
operator applied to the tangent, and the transpose is the inverse relayout. DepthToSpace in mode
``m`` is inverted by SpaceToDepth in the same mode ``m`` (DCR by the default SpaceToDepth; CRD
SpaceToDepth exists only from opset 28, so below it the inverse is spelled as the explicit
Reshape/Transpose/Reshape). Batch rules fold the batch axis into N and unfold it afterwards.

Det's derivative is the cofactor expansion ``d det(A) = sum_ij cof(A)_ij dA_ij``, which is
linear in ``dA``. The cofactors come from the determinants of all minors at once: two Gathers
with constant index tables pick, for every (i, j), the rows without i and the columns without j,
and Det (which accepts ``[*, M, M]``) evaluates them all. That needs a static matrix size, kept
small (``_MAX_DET_SIZE``) because the minors grow as n^2 (n-1)^2 elements per matrix.

Resize in mode 'nearest' copies input elements, so it is linear in X: the tangent is the same
Resize of the tangent. Its transpose scatter-adds the cotangent back to the copied elements,
whose flat indices come from the same Resize applied to an int32 grid of flat input indices
(so every coordinate mode and rounding rule is the runtime's own). Other modes and
'tf_crop_and_resize' (affine through extrapolation_value) are refused. vmap adds the batch axis
with scale 1 / the batch size, or, from opset 18, by listing the resized axes in ``axes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints, int_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import (
    BatchRule,
    JvpRule,
    TransposeRule,
    batch_rules,
    jvp_rules,
    transpose_rules,
)
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

Tangents = Sequence[ir.Value | None]
Args = Sequence[ir.Value | None]
BatchResult = tuple[list[ir.Value | None], list[bool]]

_D2S_VERSIONS = (1, 11, 13, 28)
_S2D_VERSIONS = (1, 13, 28)
_DET_VERSIONS = (11, 22)
_MAX_DET_SIZE = 4
_BIG = 2**62


def _mode(node: ir.Node) -> str:
    attr = node.attributes.get("mode")
    return "DCR" if attr is None else str(attr.as_string())


def _dim(em: Emitter, shape: ir.Value, axis: int) -> ir.Value:
    """Element ``axis`` of a 1-D shape value, as a 1-D value of one element."""
    return em.slice(shape, [axis], [axis + 1], [0])


def _space_to_depth(
    em: Emitter, y: ir.Value, blocksize: int, mode: str, x_shape: ir.Value
) -> ir.Value:
    """SpaceToDepth of ``y`` (shape ``[N, C, H*b, W*b]``) into the shape ``x_shape``.

    Uses the operator when the opset has the mode, else the explicit relayout: ``y`` viewed as
    ``[N, C, H, b, W, b]``, the two block axes moved next to C (before it for DCR, after it for
    CRD), flattened into ``[N, C*b*b, H, W]``.
    """
    if mode == "DCR" or em.opset >= 28:
        attrs: dict[str, object] = {"blocksize": blocksize}
        if mode != "DCR":
            attrs["mode"] = mode
        return em.op("SpaceToDepth", [y], attrs)
    b = em.ints([blocksize])
    split = em.op(
        "Concat", [em.ints([0, -1]), _dim(em, x_shape, 2), b, _dim(em, x_shape, 3), b], {"axis": 0}
    )
    six = em.op("Reshape", [y, split])
    moved = em.transpose(six, [0, 1, 3, 5, 2, 4])
    return em.op("Reshape", [moved, x_shape])


def _relayout_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """The operator applied to the tangent (it only moves elements)."""
    t = tangents[0]
    if t is None:
        return [None]
    return [em.op(node.op_type, [t], attributes_of(node))]


def _d2s_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """SpaceToDepth in the same mode and blocksize undoes DepthToSpace."""
    ct, x = cts[0], node.inputs[0]
    if ct is None or x is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent or input")
    blocksize = int_attr(node, "blocksize", 0)
    return [_space_to_depth(em, ct, blocksize, _mode(node), em.shape(x))]


def _s2d_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """DepthToSpace in the same mode and blocksize undoes SpaceToDepth."""
    ct = cts[0]
    if ct is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent")
    attrs: dict[str, object] = {"blocksize": int_attr(node, "blocksize", 0)}
    if _mode(node) != "DCR":
        attrs["mode"] = _mode(node)
    return [em.op("DepthToSpace", [ct], attrs)]


def _relayout_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Folds the batch axis into N (``[B, N, C, H, W]`` to ``[B*N, C, H, W]``) and back."""
    x, original = args[0], node.inputs[0]
    if x is None or original is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    one = bx.unbatched_shape(x, True, original)
    folded = bx.op(
        "Reshape",
        [x, bx.op("Concat", [bx.ints([-1]), bx.slice(one, [1], [_BIG], [0])], {"axis": 0})],
    )
    out = bx.op(node.op_type, [folded], attributes_of(node))
    rest = bx.slice(bx.op("Shape", [out]), [1], [_BIG], [0])
    target = bx.op("Concat", [bx.batch_size, bx.ints([-1]), rest], {"axis": 0})
    return [bx.op("Reshape", [out, target])], [True]


def _register(
    op_type: str,
    versions: Iterable[int],
    jvp: JvpRule,
    transpose: TransposeRule,
    batch: BatchRule,
) -> None:
    for v in versions:
        jvp_rules.add(op_type, jvp, since_version=v)
        transpose_rules.add(op_type, transpose, since_version=v)
        batch_rules.add(op_type, batch, since_version=v)


_register("DepthToSpace", _D2S_VERSIONS, _relayout_jvp, _d2s_transpose, _relayout_batch)
_register("SpaceToDepth", _S2D_VERSIONS, _relayout_jvp, _s2d_transpose, _relayout_batch)


# ------------------------------------------------------------------------------------ Det
def _det_size(node: ir.Node) -> int:
    """The static matrix size of Det's input, or an error naming the node and the limit."""
    x = node.inputs[0]
    shape = x.shape if x is not None else None
    n: object = None
    if shape is not None and shape.rank() >= 2:
        n = shape[-1]
    if not isinstance(n, int) or n > _MAX_DET_SIZE:
        found = "unknown" if n is None else (str(n) if isinstance(n, int) else f"symbolic ({n})")
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the derivative of Det is built from the "
            f"cofactors of a matrix of static size at most {_MAX_DET_SIZE}x{_MAX_DET_SIZE}, but "
            f"the matrix size here is {found}. Remedy: give the input static trailing "
            f"dimensions of at most {_MAX_DET_SIZE}, or compute the determinant from an LU or "
            "Cholesky factorisation written with differentiable operators."
        )
    return n


def _cofactors(em: Emitter, a: ir.Value, n: int, rank: int) -> ir.Value:
    """The cofactor matrices ``[*, n, n]`` of ``a`` (``[*, n, n]``, rank ``rank``, n >= 2)."""
    # Row (and column) table: entry k lists the indices other than k.
    table = np.array([[i for i in range(n) if i != k] for k in range(n)], dtype=np.int64)
    index = em.const(table)
    rows = em.op("Gather", [a, index], {"axis": rank - 2})  # [*, i, r, n]
    both = em.op("Gather", [rows, index], {"axis": rank})  # [*, i, r, j, c]
    lead = list(range(rank - 2))
    s = rank - 2
    minors = em.transpose(both, [*lead, s, s + 2, s + 1, s + 3])  # [*, i, j, r, c]
    dets = em.op("Det", [minors])  # [*, i, j]
    signs = np.array([[(-1.0) ** (i + j) for j in range(n)] for i in range(n)])
    dtype = a.dtype
    if dtype is None:
        raise InternalRuleError("Det jvp: input has no dtype")
    return em.op("Mul", [dets, em.const(signs.astype(dtype.numpy()))])


def _det_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """``d det(A) = sum_ij cof(A)_ij dA_ij`` over the last two axes."""
    t, a = tangents[0], node.inputs[0]
    if t is None:
        return [None]
    if a is None or a.shape is None:
        raise InternalRuleError(f"{op_label(node)} jvp: input without a shape")
    n = _det_size(node)
    rank = a.shape.rank()
    if n == 1:
        # det of a 1x1 matrix is its only element.
        return [em.squeeze(t, [rank - 2, rank - 1])]
    cof = _cofactors(em, a, n, rank)
    return [em.reduce_sum(em.op("Mul", [cof, t]), [rank - 2, rank - 1], keepdims=False)]


def _det_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Det already maps over the leading axes, the batch axis included."""
    x = args[0]
    if x is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    return [bx.op("Det", [x])], [True]


for _v in _DET_VERSIONS:
    jvp_rules.add("Det", _det_jvp, since_version=_v)
    batch_rules.add("Det", _det_batch, since_version=_v)


# --------------------------------------------------------------------------------- Resize
_RESIZE_VERSIONS = (10, 11, 13, 18, 19)


def _str_attr(node: ir.Node, name: str, default: str) -> str:
    attr = node.attributes.get(name)
    return default if attr is None else str(attr.as_string())


def _check_nearest(node: ir.Node) -> None:
    """Refuses the Resize configurations that are not a gather of input elements."""
    mode = _str_attr(node, "mode", "nearest")
    ctm = _str_attr(node, "coordinate_transformation_mode", "half_pixel")
    if mode != "nearest":
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): only mode 'nearest' has derivative rules, "
            f"found mode {mode!r}. Remedy: use mode 'nearest', or write the interpolation with "
            "differentiable operators (Gather, Mul, Add)."
        )
    if ctm == "tf_crop_and_resize":
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): coordinate_transformation_mode "
            "'tf_crop_and_resize' fills positions outside the roi with extrapolation_value, "
            "which is not linear in the input. Remedy: crop with Slice and resize with another "
            "coordinate_transformation_mode."
        )


def _resize_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """Nearest resizing copies input elements: the same Resize of the tangent.

    roi, scales and sizes only choose which elements are copied (piecewise constant), so their
    tangents contribute nothing.
    """
    t = tangents[0]
    if t is None:
        return [None]
    _check_nearest(node)
    return [em.op("Resize", [t, *node.inputs[1:]], attributes_of(node))]


def _resize_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """Scatter-add of the cotangent into the elements each output position copied.

    The source of every output position comes from the same Resize applied to the flat indices
    of the input (int32, exact), so ONNX's coordinate and rounding rules are applied by the
    runtime exactly as in the primal. The sum over duplicates is a ScatterElements with
    ``reduction="add"`` from opset 16, and a contraction with a one-hot matrix before.
    """
    ct, x = cts[0], node.inputs[0]
    if ct is None or x is None or x.dtype is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent or input")
    _check_nearest(node)
    shape_x = em.shape(x)
    numel = em.reduce("ReduceProd", shape_x, None, keepdims=True)
    iota = em.op(
        "Range",
        [
            em.const(np.array(0, np.int64)),
            em.squeeze(numel, [0]),
            em.const(np.array(1, np.int64)),
        ],
    )
    grid = em.op("Reshape", [em.op("Cast", [iota], {"to": ir.DataType.INT32}), shape_x])
    source = em.op("Resize", [grid, *node.inputs[1:]], attributes_of(node))
    flat_source = em.op(
        "Reshape", [em.op("Cast", [source], {"to": ir.DataType.INT64}), em.ints([-1])]
    )
    flat_ct = em.op("Reshape", [ct, em.ints([-1])])
    if em.opset >= 16:
        zeros = em.op("Expand", [em.scalar(0.0, x.dtype), numel])
        flat = em.op(
            "ScatterElements", [zeros, flat_source, flat_ct], {"axis": 0, "reduction": "add"}
        )
    else:
        one_hot = em.op(
            "Cast",
            [em.op("Equal", [em.unsqueeze(flat_source, [1]), iota])],
            {"to": x.dtype},
        )
        flat = em.op("MatMul", [flat_ct, one_hot])
    return [em.op("Reshape", [flat, shape_x]), *[None] * (len(node.inputs) - 1)]


def _resize_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Resize of one more leading axis that keeps its size (scale 1, or the batch size)."""
    for index in range(1, len(args)):
        if batched[index]:
            raise UnsupportedOperatorError(
                f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) gets a batched "
                f"roi/scales/sizes (input {index}): each example could get a different output "
                "shape, which one batched tensor cannot hold. Remedy: give the inputs it is "
                "computed from in_axes None (shared)."
            )
    x, original = args[0], node.inputs[0]
    if x is None or original is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    rank = bx.rank(original)
    inputs = list(args)
    folded = _resize_folded(bx, node, inputs, rank)
    if folded is not None:
        return [folded], [True]
    if bx.opset >= 18:
        # The axes attribute leaves the batch axis alone; scales/sizes/roi keep their length.
        axes_attr = node.attributes.get("axes")
        axes = list(axes_attr.as_ints()) if axes_attr is not None else list(range(rank))
        attrs = attributes_of(node, axes=[(a + rank if a < 0 else a) + 1 for a in axes])
        return [bx.op("Resize", inputs, attrs)], [True]
    sizes = inputs[3] if len(inputs) > 3 else None
    if sizes is not None:
        inputs[3] = bx.op("Concat", [bx.batch_size, sizes], {"axis": 0})
    else:
        index = 1 if bx.opset < 11 else 2
        scales = inputs[index]
        if scales is None:
            raise InternalRuleError(f"{op_label(node)} batch: neither scales nor sizes")
        inputs[index] = bx.op(
            "Concat", [bx.const(np.array([1.0], dtype=np.float32)), scales], {"axis": 0}
        )
    return [bx.op("Resize", inputs, attributes_of(node))], [True]


def _resize_folded(
    bx: Batcher, node: ir.Node, inputs: list[ir.Value | None], rank: int
) -> ir.Value | None:
    """Resize with the batch folded into axis 0, when axis 0 keeps its size; else None.

    onnxruntime's linear and cubic kernels only take 2-D or 4-D inputs with the outer axes
    unscaled, so an extra leading axis must not reach them: [B, d0, ...] becomes [B*d0, ...].
    """
    if rank < 1 or node.attributes.get_string("coordinate_transformation_mode", "") == (
        "tf_crop_and_resize"
    ):
        return None
    axes_attr = node.attributes.get("axes")
    axes = [a + rank if a < 0 else a for a in axes_attr.as_ints()] if axes_attr else None
    scales = inputs[2] if len(inputs) > 2 else None
    sizes = inputs[3] if len(inputs) > 3 else None
    original = node.inputs[0]
    assert original is not None and original.shape is not None
    first = 0 if axes is None else (axes.index(0) if 0 in axes else None)
    # onnxruntime runs linear and cubic Resize only on 2-D or 4-D inputs whose outer scales are
    # 1, so for those modes axis 0 keeps its size whenever the model runs at all; for nearest
    # that must be seen in constant scales or sizes.
    known_unscaled = node.attributes.get_string("mode", "nearest") != "nearest"
    if first is not None and not known_unscaled:
        if sizes is not None:
            wanted = const_ints(sizes)
            if wanted is None or original.shape.dims[0] != wanted[first]:
                return None
        elif scales is not None:
            tensor = ir.convenience.get_const_tensor(scales)
            if tensor is None or float(tensor.numpy().reshape(-1)[first]) != 1.0:
                return None
        else:
            return None
    x = inputs[0]
    assert x is not None
    merged = bx.op(
        "Concat",
        [bx.ints([-1]), bx.slice(bx.unbatched_shape(x, True, original), [1], [2**62], [0])],
        {"axis": 0},
    )
    if sizes is not None and first is not None:
        d0 = bx.slice(sizes, [first], [first + 1], [0])
        scaled = bx.op("Mul", [d0, bx.batch_size])
        parts = [
            bx.slice(sizes, [0], [first], [0]),
            scaled,
            bx.slice(sizes, [first + 1], [2**62], [0]),
        ]
        inputs = [*inputs[:3], bx.op("Concat", parts, {"axis": 0})]
    out = bx.op("Resize", [bx.op("Reshape", [x, merged]), *inputs[1:]], attributes_of(node))
    tail = bx.slice(bx.op("Shape", [out]), [1], [2**62], [0])
    return bx.op(
        "Reshape", [out, bx.op("Concat", [bx.batch_size, bx.ints([-1]), tail], {"axis": 0})]
    )


for _v in _RESIZE_VERSIONS:
    jvp_rules.add("Resize", _resize_jvp, since_version=_v)
    transpose_rules.add("Resize", _resize_transpose, since_version=_v)
    batch_rules.add("Resize", _resize_batch, since_version=_v)
