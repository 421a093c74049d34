"""RoiAlign (average mode) and MaxRoiPool: jvp, transpose and batch rules.

RoiAlign in 'avg' mode is linear in X for fixed rois: the tangent is RoiAlign of the tangent.
The transpose and the derivative with respect to the rois use the bilinear samples built in the
graph (:mod:`onnax.rules._roi_align_samples`, following onnxruntime's kernel): the transpose
scatter-adds the weighted cotangent into their taps (ScatterElements with reduction 'add', from
opset 16; before, the cotangent is contracted with the matrices the kernel itself produces from a
basis of one-hot images, ``(H*W)^2`` elements), and the rois move the sampling points, so their
tangent gathers X at the taps with the weights differentiated along the roi coordinates (the
adaptive sample count, ``ceil(roi size / output size)``, is piecewise constant). 'max' mode (the
maximum of the weighted samples) is refused with a remedy.

MaxRoiPool copies, for every output bin, the largest element of its region: the tangent gathers
the tangent of X at that element. The regions come from the runtime's own kernel applied to the
same basis (a bin's output is 1 exactly for the pixels of its region), the element from the
comparison of X with the output inside the region (the first one on ties). The rois only move the
(integer) region bounds, so their derivative is zero almost everywhere.

vmap folds the batch into C when only X is batched (both operators act per channel), and
otherwise into N and the roi axis, shifting the batch indices by ``b * N``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of
from onnax.rules._roi_align_samples import RoiSamples

__all__: list[str] = []

_BIG = 2**62


def _basis(em: Emitter, shape_x: ir.Value, dtype: ir.DataType) -> ir.Value:
    """``[1, H*W, H, W]``: image ``j`` is one at pixel ``j`` and zero elsewhere."""
    spatial = em.slice(shape_x, [2], [4], [0])
    size = em.reduce("ReduceProd", spatial, None, keepdims=True)
    iota = em.op(
        "Range",
        [em.const(np.array(0, np.int64)), em.squeeze(size, [0]), em.const(np.array(1, np.int64))],
    )
    eye = em.op("Equal", [em.unsqueeze(iota, [1]), em.unsqueeze(iota, [0])])
    shape = em.op("Concat", [em.ints([1]), size, spatial], {"axis": 0})
    return em.op("Reshape", [em.op("Cast", [eye], {"to": dtype}), shape])


# -------------------------------------------------------------------------------- RoiAlign
# One set of rules for every version from 10: 16 added coordinate_transformation_mode, which
# the rules read from the node, and ScatterElements' reduction, which they read from the opset.
roi_align = OpRules("RoiAlign", since=10)


def _check_avg(node: ir.Node, transform: str) -> None:
    mode = node.attributes.get_string("mode", "avg")
    if mode != "avg":
        raise UnsupportedOperatorError(
            f"{transform}: {op_label(node)} ({node_label(node)}) in mode {mode!r}: the maximum "
            "of bilinearly weighted samples has no derivative rule here. Remedy: use mode "
            "'avg', or MaxRoiPool."
        )


def _half_pixel(em: Emitter, node: ir.Node) -> bool:
    if em.opset < 16:
        return False  # RoiAlign-10 samples like 'output_half_pixel'
    return node.attributes.get_string("coordinate_transformation_mode", "half_pixel") == (
        "half_pixel"
    )


def _samples(em: Emitter, node: ir.Node, x: ir.Value) -> RoiSamples:
    rois, index = node.inputs[1], node.inputs[2]
    if rois is None or index is None:
        raise InternalRuleError(f"{op_label(node)}: missing rois or batch indices")
    return RoiSamples(em, node, x, rois, index, half_pixel=_half_pixel(em, node))


def _per_channel_view(em: Emitter, v: ir.Value, shape_x: ir.Value) -> ir.Value:
    """``[N, C, H, W]`` as ``[C, N*H*W]``."""
    c = em.slice(shape_x, [1], [2], [0])
    moved = em.transpose(v, [1, 0, 2, 3])
    return em.op("Reshape", [moved, em.op("Concat", [c, em.ints([-1])], {"axis": 0})])


@roi_align.jvp
def _roi_align_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """RoiAlign of the tangent of X, plus the moves of the sampling points with the rois."""
    t = tangents[0]
    t_rois = tangents[1] if len(tangents) > 1 else None
    x, y = node.inputs[0], node.outputs[0]
    if x is None:
        raise InternalRuleError(f"{op_label(node)} jvp: missing input")
    _check_avg(node, "jvp")
    terms: list[ir.Value | None] = []
    if t is not None:
        terms.append(em.op("RoiAlign", [t, *node.inputs[1:]], attributes_of(node)))
    if t_rois is not None:
        s = _samples(em, node, x)
        shape_x = em.shape(x)
        c = em.slice(shape_x, [1], [2], [0])
        flat_index = em.op(
            "Expand",
            [
                em.op("Reshape", [s.index, em.ints([1, -1])]),
                em.op("Concat", [c, em.ints([1])], {"axis": 0}),
            ],
        )
        values = em.op(
            "GatherElements", [_per_channel_view(em, x, shape_x), flat_index], {"axis": 1}
        )
        k = em.slice(em.shape(s.index), [0], [1], [0])
        values = em.op(
            "Reshape", [values, em.op("Concat", [c, k, em.ints([s.outputs, -1])], {"axis": 0})]
        )
        for j in range(4):
            coefficient = em.reduce_sum(
                em.op("Mul", [values, em.unsqueeze(s.roi_slopes[j], [0])]), [3], keepdims=False
            )  # [C, K, O]
            component = em.op("Gather", [t_rois, em.const(np.array(j, np.int64))], {"axis": 1})
            term = em.op("Mul", [coefficient, em.unsqueeze(component, [0, 2])])
            terms.append(em.op("Reshape", [em.transpose(term, [1, 0, 2]), em.shape(y)]))
    return [em.add_all(terms)]


@roi_align.transpose
def _roi_align_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """Scatter-add of the weighted cotangent into the samples' taps (X linear, rois fixed)."""
    ct, x = cts[0], node.inputs[0]
    if ct is None or x is None or x.dtype is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent or input")
    if em.opset < 16:
        # No ScatterElements reduction before 16: contract with the kernel's own weights.
        return _roi_align_transpose_basis(em, node, ct, x)
    s = _samples(em, node, x)
    shape_x = em.shape(x)
    c = em.slice(shape_x, [1], [2], [0])
    k_c_o = em.op("Reshape", [ct, em.ints([0, 0, -1])])
    c_k_o = em.unsqueeze(em.transpose(k_c_o, [1, 0, 2]), [3])  # [C, K, O, 1]
    updates = em.op("Mul", [c_k_o, em.unsqueeze(s.weights, [0])])  # [C, K, O, 4G]
    flat_updates = em.op("Reshape", [updates, em.op("Concat", [c, em.ints([-1])], {"axis": 0})])
    flat_index = em.op(
        "Expand",
        [em.op("Reshape", [s.index, em.ints([1, -1])]), em.op("Shape", [flat_updates])],
    )
    size = em.reduce("ReduceProd", shape_x, None, keepdims=True)
    per_channel = em.op("Div", [size, c])
    zeros = em.op(
        "Expand", [em.scalar(0.0, x.dtype), em.op("Concat", [c, per_channel], {"axis": 0})]
    )
    scattered = em.op(
        "ScatterElements", [zeros, flat_index, flat_updates], {"axis": 1, "reduction": "add"}
    )  # [C, N*H*W]
    n_hw = em.op(
        "Concat",
        [c, em.slice(shape_x, [0], [1], [0]), em.slice(shape_x, [2], [4], [0])],
        {"axis": 0},
    )
    images = em.transpose(em.op("Reshape", [scattered, n_hw]), [1, 0, 2, 3])
    return [images, None, None]


def _roi_align_transpose_basis(
    em: Emitter, node: ir.Node, ct: ir.Value, x: ir.Value
) -> list[ir.Value | None]:
    """``ct_X[n] = sum_{k: index_k = n} M_k ct[k]`` with ``M`` from RoiAlign of a basis.

    Costs ``(H*W)^2`` elements for the basis: used only below opset 16.
    """
    rois, index = node.inputs[1], node.inputs[2]
    assert rois is not None and index is not None and x.dtype is not None
    shape_x = em.shape(x)
    basis = _basis(em, shape_x, x.dtype)
    pointed = em.op("Mul", [index, em.const(np.array(0, np.int64))])
    weights = em.op("RoiAlign", [basis, rois, pointed], attributes_of(node))  # [K, HW, oh, ow]
    k_hw_o = em.op("Reshape", [weights, em.ints([0, 0, -1])])
    k_c_o = em.op("Reshape", [ct, em.ints([0, 0, -1])])
    per_roi = em.op("MatMul", [k_c_o, em.transpose(k_hw_o, [0, 2, 1])])  # [K, C, HW]
    return [_sum_into_images(em, per_roi, index, shape_x, x.dtype), None, None]


def _sum_into_images(
    em: Emitter, per_roi: ir.Value, index: ir.Value, shape_x: ir.Value, dtype: ir.DataType
) -> ir.Value:
    """``[K, C, H*W]`` contributions summed into ``[N, C, H, W]`` by their batch indices."""
    n = em.slice(shape_x, [0], [1], [0])
    images = em.op(
        "Range",
        [em.const(np.array(0, np.int64)), em.squeeze(n, [0]), em.const(np.array(1, np.int64))],
    )
    hot = em.op("Equal", [em.unsqueeze(images, [1]), em.unsqueeze(index, [0])])  # [N, K]
    flat = em.op("Reshape", [per_roi, em.ints([0, -1])])
    summed = em.op("MatMul", [em.op("Cast", [hot], {"to": dtype}), flat])
    return em.op("Reshape", [summed, shape_x])


@roi_align.batch
def _roi_align_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """X only: fold into C. Otherwise fold into N and the rois, shifting the batch indices."""
    x, rois, index = args[0], args[1], args[2]
    if x is None or rois is None or index is None or node.inputs[0] is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    attrs = attributes_of(node)
    if not batched[1] and not batched[2]:
        return [_per_channel(bx, "RoiAlign", [x, rois, index], attrs)], [True]
    x_b = bx.materialize(x, batched[0], node.inputs[0])
    n = bx.slice(bx.unbatched_shape(x_b, True, node.inputs[0]), [0], [1], [0])
    folded_x = bx.op(
        "Reshape", [x_b, bx.op("Concat", [bx.ints([-1]), _tail(bx, x_b, 2)], {"axis": 0})]
    )
    assert node.inputs[1] is not None and node.inputs[2] is not None
    rois_b = bx.materialize(rois, batched[1], node.inputs[1])
    index_b = bx.materialize(index, batched[2], node.inputs[2])
    shifted = bx.op("Add", [index_b, _offsets(bx, n)])  # [B, K]
    out = bx.op(
        "RoiAlign",
        [
            folded_x,
            bx.op("Reshape", [rois_b, bx.ints([-1, 4])]),
            bx.op("Reshape", [shifted, bx.ints([-1])]),
        ],
        attrs,
    )
    return [_unfold(bx, out)], [True]


def _tail(bx: Batcher, v: ir.Value, start: int) -> ir.Value:
    return bx.slice(bx.op("Shape", [v]), [start], [_BIG], [0])


def _offsets(bx: Batcher, n: ir.Value) -> ir.Value:
    """``[B, 1]``: ``b * N`` for every example ``b``."""
    steps = bx.op(
        "Range",
        [
            bx.const(np.array(0, np.int64)),
            bx.squeeze(bx.batch_size, [0]),
            bx.const(np.array(1, np.int64)),
        ],
    )
    return bx.unsqueeze(bx.op("Mul", [steps, n]), [1])


def _unfold(bx: Batcher, out: ir.Value) -> ir.Value:
    """``[B*K, ...]`` to ``[B, K, ...]``."""
    target = bx.op("Concat", [bx.batch_size, bx.ints([-1]), _tail(bx, out, 1)], {"axis": 0})
    return bx.op("Reshape", [out, target])


def _per_channel(
    bx: Batcher, op_type: str, inputs: list[ir.Value], attrs: dict[str, object]
) -> ir.Value:
    """``op`` of a batched ``[B, N, C, H, W]`` X as ``[N, B*C, H, W]``, back to ``[B, K, C, ...]``."""
    x = inputs[0]
    moved = bx.transpose(x, [1, 0, 2, 3, 4])
    folded = bx.op(
        "Reshape", [moved, bx.op("Concat", [bx.ints([0, -1]), _tail(bx, x, 3)], {"axis": 0})]
    )
    out = bx.op(op_type, [folded, *inputs[1:]], attrs)  # [K, B*C, oh, ow]
    split = bx.op(
        "Reshape",
        [
            out,
            bx.op(
                "Concat",
                [bx.ints([0]), bx.batch_size, bx.ints([-1]), _tail(bx, out, 2)],
                {"axis": 0},
            ),
        ],
    )
    return bx.transpose(split, [1, 0, 2, 3, 4])


# ------------------------------------------------------------------------------ MaxRoiPool
max_roi_pool = OpRules("MaxRoiPool", since=1)


def _max_roi_pool_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    """The tangent of X at the element each bin copies (rois: zero almost everywhere)."""
    x, rois, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if x is None or rois is None or x.dtype is None:
        raise InternalRuleError(f"{op_label(node)} jvp: missing input")
    shape_x = em.shape(x)
    index = em.op(
        "Cast",
        [em.op("Gather", [rois, em.const(np.array(0, np.int64))], {"axis": 1})],
        {"to": ir.DataType.INT64},
    )
    # Every roi pointed at the single basis image: bin (k, o) is 1 at the pixels of its region.
    first = em.slice(rois, [1], [_BIG], [1])
    pointed = em.op(
        "Concat",
        [em.op("Mul", [em.slice(rois, [0], [1], [1]), em.scalar(0.0, rois)]), first],
        {"axis": 1},
    )
    regions = em.op("MaxRoiPool", [_basis(em, shape_x, x.dtype), pointed], attributes_of(node))
    region = em.op(
        "Greater", [em.op("Reshape", [regions, em.ints([0, 0, -1])]), em.scalar(0.5, x.dtype)]
    )  # [K, HW, O]
    per_roi = em.op("Reshape", [em.op("Gather", [x, index], {"axis": 0}), em.ints([0, 0, -1])])
    flat_y = em.op("Reshape", [y, em.ints([0, 0, -1])])  # [K, C, O]
    hit = em.op(
        "And",
        [
            em.op("Equal", [em.unsqueeze(per_roi, [3]), em.unsqueeze(flat_y, [2])]),
            em.unsqueeze(region, [1]),
        ],
    )  # [K, C, HW, O]
    hit_int = em.op("Cast", [hit], {"to": ir.DataType.INT32})
    argmax = em.op("ArgMax", [hit_int], {"axis": 2, "keepdims": 0})  # [K, C, O]
    found = em.op("Cast", [em.reduce("ReduceMax", hit_int, [2], keepdims=False)], {"to": x.dtype})
    t_roi = em.op("Reshape", [em.op("Gather", [t, index], {"axis": 0}), em.ints([0, 0, -1])])
    picked = em.op("GatherElements", [t_roi, argmax], {"axis": 2})
    return em.op("Reshape", [em.op("Mul", [picked, found]), em.shape(y)])


max_roi_pool.defjvp(_max_roi_pool_tangent)


@max_roi_pool.batch
def _max_roi_pool_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """X only: fold into C. Otherwise fold into N and the rois, shifting their batch column."""
    x, rois = args[0], args[1]
    if x is None or rois is None or node.inputs[0] is None or node.inputs[1] is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    attrs = attributes_of(node)
    if not batched[1]:
        return [_per_channel(bx, "MaxRoiPool", [x, rois], attrs)], [True]
    x_b = bx.materialize(x, batched[0], node.inputs[0])
    n = bx.slice(bx.unbatched_shape(x_b, True, node.inputs[0]), [0], [1], [0])
    folded_x = bx.op(
        "Reshape", [x_b, bx.op("Concat", [bx.ints([-1]), _tail(bx, x_b, 2)], {"axis": 0})]
    )
    dtype = node.inputs[1].dtype or ir.DataType.FLOAT
    # The kernel truncates the batch column to an integer: shift the truncated value.
    whole = bx.op("Cast", [bx.slice(rois, [0], [1], [2])], {"to": ir.DataType.INT64})
    shifted = bx.op("Add", [whole, bx.unsqueeze(_offsets(bx, n), [2])])  # [B, K, 1]
    column = bx.op("Cast", [shifted], {"to": dtype})
    moved = bx.op("Concat", [column, bx.slice(rois, [1], [_BIG], [2])], {"axis": 2})
    out = bx.op("MaxRoiPool", [folded_x, bx.op("Reshape", [moved, bx.ints([-1, 5])])], attrs)
    return [_unfold(bx, out)], [True]
