"""Col2Im and DeformConv.

* **Col2Im** (18) sums blocks back into an image: it is linear in its input, so the tangent is
  Col2Im of the tangent. Its transpose extracts the blocks again (im2col): every channel of the
  cotangent image becomes its own example (``[N*C, 1, *image]``) and a ``Conv`` with a one-hot
  kernel ``[K, 1, *block]`` (K = the block's size) and the node's strides, pads and dilations
  reads, as output channel ``k``, the image element at block position ``k`` of each block; a
  reshape to ``[N, C*K, L]`` gives Col2Im's (channel-major, then block position) layout. A
  run-time block shape builds that kernel in the graph (``EyeLike``, reshaped).
* **DeformConv** (19, 22) is lowered to primitives (:data:`onnax.core.registry.lowerings`), whose
  rules then give every derivative (X, W, offset, B, mask) and vmap. The lowering samples ``X``
  bilinearly at ``p = o * stride - pad_begin + k * dilation + offset`` as four weighted
  ``GatherElements`` of the flattened image (one per corner of the cell, a corner outside the
  image weighing zero, as in onnxruntime's and torchvision's kernels), scales by the mask, and
  contracts the ``[N, C*K, P]`` columns with the weight as a grouped ``MatMul``. The corner
  indices come from ``Floor`` (a zero derivative), the corner weights are linear in the
  fractional parts of ``p``, so the derivative with respect to the offset is the derivative of
  the bilinear interpolation (undefined where a sampling position is an integer: there the
  lowering takes the derivative of the cell above). Only 2-D DeformConv is lowered (onnxruntime
  and the ONNX reference implement that one), with static channel, image, kernel and output
  sizes.

Col2Im's batch rule folds the vmap axis into the node's batch axis; a batched image or block
shape would give each example its own output shape and is refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints, int_attr, ints_attr
from onnax.core.batching import Batcher, refuse_batched
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, linear_unary_jvp
from onnax.rules._windows import fold_batch, unfold_batch


# ------------------------------------------------------------------------------- Col2Im
def _one_hot_kernel(em: Emitter, node: ir.Node, dtype: ir.DataType) -> ir.Value:
    """``[K, 1, *block]`` with a one at block position ``k`` of output channel ``k``.

    A constant for a constant block shape, else built in the graph (an identity from
    ``EyeLike``, reshaped by the run-time block shape).
    """
    block = node.inputs[2]
    assert block is not None
    static = const_ints(block)
    if static is not None:
        count = int(np.prod(static))
        return em.const(np.eye(count, dtype=dtype.numpy()).reshape(count, 1, *static))
    size = em.reduce("ReduceProd", block, [0], keepdims=True)
    square = em.op(
        "ConstantOfShape",
        [em.op("Concat", [size, size], {"axis": 0})],
        {"value": ir.tensor(np.zeros(1, dtype=dtype.numpy()))},
    )
    eye = em.op("EyeLike", [square])
    return em.op("Reshape", [eye, em.op("Concat", [size, em.ints([1]), block], {"axis": 0})])


col2im = OpRules("Col2Im", since=18)
col2im.jvp(linear_unary_jvp)  # linear in its input: Col2Im of the tangent


@col2im.transpose
def _col2im_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    x, image = node.inputs[0], node.inputs[1]
    assert ct is not None and x is not None and image is not None
    dtype = node.outputs[0].dtype or x.dtype
    assert dtype is not None
    single = em.op("Reshape", [ct, em.op("Concat", [em.ints([-1, 1]), image], {"axis": 0})])
    attrs = {
        "kernel_shape": const_ints(node.inputs[2]),
        "strides": ints_attr(node, "strides"),
        "pads": ints_attr(node, "pads"),
        "dilations": ints_attr(node, "dilations"),
    }
    patches = em.op("Conv", [single, _one_hot_kernel(em, node, dtype)], attrs)  # [N*C, K, *blocks]
    return [em.op("Reshape", [patches, em.shape(x)]), None, None]


@col2im.batch
def _col2im_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    refuse_batched(bx, node, args, batched, {1: "image_shape", 2: "block_shape"})
    x, x0, y0 = args[0], node.inputs[0], node.outputs[0]
    assert x is not None and x0 is not None
    folded = fold_batch(bx, x, x0, 3)
    y = bx.op("Col2Im", [folded, *args[1:]], attributes_of(node))
    return [unfold_batch(bx, y, y0)], [True]


# --------------------------------------------------------------------------- DeformConv
def _static(node: ir.Node, value: ir.Value | None, axes: Sequence[int], what: str) -> list[int]:
    dims = value.shape.dims if value is not None and value.shape is not None else None
    got = [dims[a] for a in axes] if dims is not None else []
    if dims is None or not all(isinstance(d, int) for d in got):
        name = value.name if value is not None else "?"
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): onnax lowers DeformConv to primitives to "
            f"differentiate or batch it, which needs the {what} of {name!r} to be static (shape "
            f"{None if value is None else value.shape}). Remedy: give the model's inputs static "
            "channel and spatial sizes (only the batch dimension may be symbolic)."
        )
    return [int(d) for d in got]  # type: ignore[arg-type]


deform_conv = OpRules("DeformConv", since=19)


@deform_conv.lowering
def deform_conv_lowering(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    """DeformConv (2-D) as bilinear sampling by GatherElements and a grouped MatMul."""
    x, w, offset = node.inputs[0], node.inputs[1], node.inputs[2]
    bias = node.inputs[3] if len(node.inputs) > 3 else None
    mask = node.inputs[4] if len(node.inputs) > 4 else None
    assert x is not None and w is not None and offset is not None
    if x.shape is None or x.shape.rank() != 4:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): only 2-D DeformConv (a rank-4 X) can be "
            f"differentiated or batched; X {x.name!r} has shape {x.shape}. Remedy: reshape the "
            "problem to two spatial dimensions (a size-1 axis for 1-D)."
        )
    c, h, wd = _static(node, x, [1, 2, 3], "channel and spatial sizes")
    m, cw = _static(node, w, [0, 1], "output and input channel counts")
    kernel = ints_attr(node, "kernel_shape") or _static(node, w, [2, 3], "kernel size")
    kh, kw = kernel
    group = int_attr(node, "group", 1)
    offset_group = int_attr(node, "offset_group", 1)
    sh, sw = ints_attr(node, "strides", [1, 1]) or [1, 1]
    dh, dw = ints_attr(node, "dilations", [1, 1]) or [1, 1]
    pt, pl, pb, pr = ints_attr(node, "pads", [0, 0, 0, 0]) or [0, 0, 0, 0]
    oh = (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (wd + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    k, p = kh * kw, oh * ow
    g, cg = offset_group, c // offset_group
    dtype = x.dtype
    assert dtype is not None
    np_dtype = dtype.numpy()

    def c_(a: np.ndarray | float) -> ir.Value:
        return em.const(np.asarray(a, dtype=np_dtype))

    # Sampling positions [N, G, K, P] (rows and columns), offsets laid out as (g, k, [h, w]).
    off = em.op("Reshape", [offset, em.ints([0, g, k, 2, p])])
    kk, pp = np.meshgrid(np.arange(k), np.arange(p), indexing="ij")
    base_h = (kk // kw) * dh + (pp // ow) * sh - pt
    base_w = (kk % kw) * dw + (pp % ow) * sw - pl
    index0, index1 = em.const(np.array(0, np.int64)), em.const(np.array(1, np.int64))
    ph = em.op("Add", [em.op("Gather", [off, index0], {"axis": 3}), c_(base_h)])
    pw = em.op("Add", [em.op("Gather", [off, index1], {"axis": 3}), c_(base_w)])
    h0, w0 = em.op("Floor", [ph]), em.op("Floor", [pw])
    fh, fw = em.op("Sub", [ph, h0]), em.op("Sub", [pw, w0])
    flat_shape = em.ints([0, g, 1, k * p])
    image = em.op("Reshape", [x, em.ints([0, g, cg, h * wd])])
    index_shape = em.ints([1, 1, cg, 1])
    terms = []
    for a, b in itertools.product((0, 1), repeat=2):
        hc = em.op("Add", [h0, c_(float(a))]) if a else h0
        wc = em.op("Add", [w0, c_(float(b))]) if b else w0
        inside = em.op(
            "And",
            [
                em.op(
                    "And",
                    [
                        em.op("GreaterOrEqual", [hc, c_(0.0)]),
                        em.op("LessOrEqual", [hc, c_(float(h - 1))]),
                    ],
                ),
                em.op(
                    "And",
                    [
                        em.op("GreaterOrEqual", [wc, c_(0.0)]),
                        em.op("LessOrEqual", [wc, c_(float(wd - 1))]),
                    ],
                ),
            ],
        )
        weight_h = fh if a else em.op("Sub", [c_(1.0), fh])
        weight_w = fw if b else em.op("Sub", [c_(1.0), fw])
        weight = em.op("Where", [inside, em.op("Mul", [weight_h, weight_w]), c_(0.0)])
        row = em.op("Clip", [hc, c_(0.0), c_(float(h - 1))])
        col = em.op("Clip", [wc, c_(0.0), c_(float(wd - 1))])
        flat = em.op("Add", [em.op("Mul", [row, c_(float(wd))]), col])
        idx = em.op("Cast", [em.op("Reshape", [flat, flat_shape])], {"to": ir.DataType.INT64})
        idx = em.op("Expand", [idx, index_shape])  # [N, G, Cg, K*P]
        sampled = em.op("GatherElements", [image, idx], {"axis": 3})
        terms.append(em.op("Mul", [sampled, em.op("Reshape", [weight, flat_shape])]))
    cols = em.add_all(terms)
    assert cols is not None
    if mask is not None:
        cols = em.op("Mul", [cols, em.op("Reshape", [mask, flat_shape])])
    # [N, G, Cg, K*P] is [N, C*K, P] channel-major; group the channels for the weight.
    cols = em.op("Reshape", [cols, em.ints([0, group, cw * k, p])])
    weight = em.op("Reshape", [w, em.ints([group, m // group, cw * k])])
    y = em.op("MatMul", [weight, cols])  # [N, group, M/group, P]
    y = em.op("Reshape", [y, em.ints([0, m, oh, ow])])
    if bias is not None:
        y = em.op("Add", [y, em.op("Reshape", [bias, em.ints([m, 1, 1])])])
    return [y]
