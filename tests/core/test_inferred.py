"""Inference that passes over known nodes (``infer_shapes(new_only=True)``) finds what a full one
finds.

Each case infers a model, changes it the way a transform does (a node added that reads old
values, an old node's input replaced or attribute changed), and infers again with ``new_only``.
The oracle, which knows nothing of the record, is full inference on a copy taken just before
(a copied node has no record), and where the engine is exact, inference from scratch on a copy
without any inferred shape. Under the record kept before (every node the last inference saw,
passed over when its outputs were fully known), each of these kept a stale or missing shape.
"""

from __future__ import annotations

import onnx_ir as ir

from onnax.core.inference import _settled_constants, infer_shapes
from onnax.core.inferred import unchanged

HEADER = '<ir_version: 10, opset_import: ["" : 17]>\n'

Shapes = dict[str, tuple[ir.DataType | None, tuple[int | str | None, ...] | None]]


def _shapes(model: ir.Model) -> Shapes:
    return {
        str(v.name): (
            v.dtype,
            None
            if v.shape is None
            else tuple(d if isinstance(d, int) else d.value for d in v.shape.dims),
        )
        for node in model.graph
        for v in node.outputs
    }


def _from_scratch(model: ir.Model) -> Shapes:
    """Full inference on a copy whose values have no type or shape but the declared ones."""
    copy = ir.from_proto(ir.to_proto(model))
    for node in copy.graph:
        for v in node.outputs:
            if not v.is_graph_output():
                v.shape = None
                v.type = None
    infer_shapes(copy)
    return _shapes(copy)


def _infer_again(model: ir.Model) -> Shapes:
    """``infer_shapes(new_only=True)``, checked against full inference from the same state.

    Without completion, as cleanup infers a transform's result: completion's later rounds
    infer every node and would hide a stale first round.
    """
    copy = model.clone()
    infer_shapes(copy, complete=False)
    infer_shapes(model, complete=False, new_only=True)
    assert _shapes(model) == _shapes(copy)
    return _shapes(model)


def _node(model: ir.Model, op_type: str) -> ir.Node:
    return next(n for n in model.graph if n.op_type == op_type)


def _add_output(model: ir.Model, op_type: str, inputs: list[ir.Value], name: str) -> ir.Value:
    node = ir.node(op_type, inputs)
    node.outputs[0].name = name
    model.graph.append(node)
    model.graph.outputs.append(node.outputs[0])
    return node.outputs[0]


def test_a_new_node_reads_an_old_constant() -> None:
    """A passed-over Constant without const_value hid its value: the Squeeze kept its input's rank
    (test_conv_grad's pw_groups_strided_tail, whose vjp of a vjp the checker then refused)."""
    model = ir.from_onnx_text(
        HEADER
        + """
        g (float[N, 3, 1] x) => (float[N, 3, 1] y) {
            c = Constant <value = int64[1] {1}> ()
            u = ReduceSum <keepdims = 1> (x, c)
            y = Identity (x)
        }
        """
    )
    infer_shapes(
        model, record=True
    )  # folding reads no constant here: ReduceSum of floats is not folded
    u = _node(model, "ReduceSum").outputs[0]
    c = _node(model, "Constant").outputs[0]
    s = _add_output(model, "Squeeze", [u, c], "s")
    assert _infer_again(model) == _from_scratch(model)
    assert s.shape == ir.Shape(["N", 1])  # not every 1 squeezed, as for unknown axes


def test_a_new_node_reads_symbolic_shape_contents() -> None:
    """The contents of ``Shape(x)`` ([N, 4]) live in one inference run only: a Reshape to them
    added later needs the Shape inferred again."""
    model = ir.from_onnx_text(
        HEADER
        + """
        g (float[N, 4] x, float[M] t) => (float[N, 4] y) {
            s = Shape (x)
            y = Identity (x)
        }
        """
    )
    infer_shapes(model, record=True)
    shape = _node(model, "Shape").outputs[0]
    t = model.graph.inputs[1]
    r = _add_output(model, "Reshape", [t, shape], "r")
    assert _infer_again(model) == _from_scratch(model)
    assert r.shape == ir.Shape(["N", 4])


def test_an_old_node_whose_input_was_replaced() -> None:
    """Inference refines the old shape [N, 4] with the new input's [3, 4]."""
    model = ir.from_onnx_text(
        HEADER
        + """
        g (float[N, 4] x, float[3, 4] z) => (float[N, 4] y) {
            a = Relu (x)
            y = Identity (x)
        }
        """
    )
    infer_shapes(model, record=True)
    relu = _node(model, "Relu")
    relu.replace_input_with(0, model.graph.inputs[1])
    b = _add_output(model, "Neg", [relu.outputs[0]], "b")
    _infer_again(model)
    assert relu.outputs[0].shape == b.shape == ir.Shape([3, 4])


def test_an_old_node_whose_attribute_changed() -> None:
    """Inference refines the old [4, N] with the new [N, 4] dimension by dimension (it never
    takes back a dimension, so that is [4, 4]: what a full inference says, if not what the
    model means)."""
    model = ir.from_onnx_text(
        HEADER
        + """
        g (float[N, 4] x) => (float[N, 4] y) {
            a = Transpose <perm = [1, 0]> (x)
            y = Identity (x)
        }
        """
    )
    infer_shapes(model, record=True)
    transpose = _node(model, "Transpose")
    transpose.attributes["perm"] = ir.AttrInt64s("perm", [0, 1])
    _add_output(model, "Neg", [transpose.outputs[0]], "b")
    _infer_again(model)
    assert transpose.outputs[0].shape == ir.Shape([4, 4])


def test_unchanged_nodes_are_passed_over() -> None:
    """What the record is for: an old node nothing touched is not inferred again."""
    model = ir.from_onnx_text(
        HEADER
        + """
        g (float[N, 4] x) => (float[N, 4] y) {
            a = Relu (x)
            y = Identity (x)
        }
        """
    )
    infer_shapes(model, record=True)
    relu = _node(model, "Relu")
    _add_output(model, "Neg", [relu.outputs[0]], "b")
    assert unchanged(model) == [relu]
    copy = ir.from_proto(ir.to_proto(model))
    assert unchanged(copy) == []  # a copied node is not one that inference saw


def test_a_settled_constant_is_read_while_passed_over() -> None:
    """A Constant whose output carries its tensor (as emitted and cloned ones do) is passed over
    in every round; its consumers read the tensor all the same."""
    model = ir.from_onnx_text(
        HEADER
        + """
        g (float[N, 3, 1] x) => (float[N, 3] y) {
            c = Constant <value = int64[1] {2}> ()
            y = Squeeze (x, c)
        }
        """
    )
    constant = _node(model, "Constant")
    c = constant.outputs[0]
    c.const_value = constant.attributes["value"].value
    c.dtype, c.shape = ir.DataType.INT64, ir.Shape([1])
    assert _settled_constants(model) == [constant]
    y = model.graph.outputs[0]
    y.shape = None
    infer_shapes(model, record=True)
    assert y.shape == ir.Shape(["N", 3])
    # Passed over twice in one round (settled, and unchanged since the record): the domain it
    # was moved out of comes back, not the private one.
    assert unchanged(model) == [constant]
    infer_shapes(model, new_only=True)
    assert constant.domain == ""
    assert _from_scratch(model)["y"] == (ir.DataType.FLOAT, ("N", 3))
