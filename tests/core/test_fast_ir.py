"""new_shape builds the very object ir.Shape builds (the oracle), state and behaviour."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from onnax.core import fast_ir
from onnax.core.fast_ir import new_shape

_DIMS = [
    [],
    [3],
    [ir.SymbolicDim("N"), 4, 8],
    [ir.SymbolicDim(None), 1, ir.SymbolicDim("M")],
]


def test_builds_directly() -> None:
    """On the installed onnx_ir the direct construction is the one in use."""
    assert fast_ir._BUILD is fast_ir._direct


@pytest.mark.parametrize("dims", _DIMS)
def test_same_state_as_the_constructor(dims: list[fast_ir.Dim]) -> None:
    mine, theirs = new_shape(list(dims)), ir.Shape(dims)
    assert fast_ir._state(mine) == fast_ir._state(theirs)
    assert mine == theirs and mine.dims == theirs.dims
    assert not mine.frozen and [mine.get_denotation(i) for i in range(len(dims))] == [None] * len(
        dims
    )
    proto_a = ir.to_proto(ir.Value(name="v", type=ir.TensorType(ir.DataType.FLOAT), shape=mine))
    proto_b = ir.to_proto(ir.Value(name="v", type=ir.TensorType(ir.DataType.FLOAT), shape=theirs))
    assert proto_a == proto_b


def test_shape_is_mutable_like_the_constructors() -> None:
    shape = new_shape([1, 2])
    shape[0] = 5
    assert shape.dims == (5, 2)
    shape.freeze()
    with pytest.raises(TypeError):
        shape[1] = 3


# ------------------------------------------------------------------------------ nodes
_FLOAT = ir.TensorType(ir.DataType.FLOAT)


def test_builds_nodes_directly() -> None:
    """On the installed onnx_ir the direct construction of nodes is the one in use."""
    assert fast_ir._BUILD_NODE is fast_ir._direct_node


def _attrs() -> list[ir.Attr]:
    return [
        ir.Attr("axis", ir.AttributeType.INT, 1),
        ir.Attr("perm", ir.AttributeType.INTS, [1, 0]),
        ir.Attr("value", ir.AttributeType.TENSOR, ir.tensor([1.0, 2.0])),
    ]


@pytest.mark.parametrize("domain", ["", "ai.onnx", "com.microsoft"])
@pytest.mark.parametrize("num_outputs", [0, 1, 3])
@pytest.mark.parametrize("with_attributes", [False, True])
def test_new_node_has_the_constructors_state(
    domain: str, num_outputs: int, with_attributes: bool
) -> None:
    x, y = ir.Value(name="x"), ir.Value(name="y")
    attrs = _attrs() if with_attributes else []
    inputs = [x, None, y, x]
    theirs = ir.Node(domain, "Op", inputs, attributes=attrs, num_outputs=num_outputs)
    mine = fast_ir.new_node(domain, "Op", inputs, attrs, num_outputs)
    assert fast_ir._node_state(mine) == fast_ir._node_state(theirs)
    # The inputs know the node as a use at each position, after the constructor's node.
    expected = [(False, 0), (False, 3), (True, 0), (True, 3)]
    assert [(u.node is mine, u.idx) for u in x.uses()] == expected
    assert [(u.node is mine, u.idx) for u in y.uses()] == [(False, 2), (True, 2)]
    assert all(out.producer() is mine for out in mine.outputs)
    assert [out.index() for out in mine.outputs] == list(range(num_outputs))
    assert mine.attributes.keys() == theirs.attributes.keys()


def _graph_of(build: object) -> ir.Model:
    """y = Transpose(Add(x, x)) with nodes from ``build`` (new_node or the constructor)."""
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape([2, 3]))
    make = fast_ir.new_node if build == "new_node" else fast_ir._constructed
    add = make("", "Add", [x, x], [], 1)
    perm = ir.Attr("perm", ir.AttributeType.INTS, [1, 0])
    transpose = make("", "Transpose", [add.outputs[0]], [perm], 1)
    transpose.outputs[0].name = "y"
    graph = ir.Graph([x], [transpose.outputs[0]], nodes=[add, transpose], opset_imports={"": 18})
    return ir.Model(graph, ir_version=9)


def test_new_nodes_behave_as_constructed_ones() -> None:
    ours, theirs = _graph_of("new_node"), _graph_of("constructor")
    assert ir.to_proto(ours) == ir.to_proto(theirs)  # named alike by the graph
    # Edits: a node reading elsewhere drops its use, a removed node leaves the graph.
    for model in (ours, theirs):
        add, transpose = list(model.graph)
        transpose.replace_input_with(0, model.graph.inputs[0])
        assert not add.outputs[0].uses()
        model.graph.remove(add, safe=True)
    assert ir.to_proto(ours) == ir.to_proto(theirs)


def test_the_check_falls_back_to_the_constructor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A direct build that differs from the constructor's (here: a named node) is not used."""
    direct = fast_ir._direct_node

    def named(*args: object) -> ir.Node:
        node = direct(*args)  # type: ignore[arg-type]
        node.name = "n"
        return node

    monkeypatch.setattr(fast_ir, "_direct_node", named)
    assert fast_ir._checked_node()[0] is fast_ir._constructed
    monkeypatch.setattr(fast_ir, "_direct_node", direct)
    assert fast_ir._checked_node()[0] is direct


def test_new_node_with_a_copys_arguments_has_the_constructors_state() -> None:
    x = ir.Value(name="x")
    args = {"name": "n", "overload": "o", "version": 3, "doc_string": "d"}
    attrs = _attrs()

    def outputs() -> list[ir.Value]:
        return [ir.Value(name=f"y{i}", type=_FLOAT, shape=ir.Shape([2])) for i in range(2)]

    theirs = fast_ir._constructed(
        "", "Split", [x], attrs, 2, outputs=outputs(), metadata_props={"k": "v"}, **args
    )
    mine = fast_ir.new_node(
        "", "Split", [x], attrs, 2, outputs=outputs(), metadata_props={"k": "v"}, **args
    )
    assert fast_ir._node_state(mine) == fast_ir._node_state(theirs)
    assert [(v.name, v.producer() is mine, v.index()) for v in mine.outputs] == [
        ("y0", True, 0),
        ("y1", True, 1),
    ]


# ------------------------------------------------------------------------- detaching
def test_detaches_directly() -> None:
    assert fast_ir._DETACH is fast_ir._detach_direct


@pytest.mark.parametrize("inputs", [[], [None], ["a"], ["a", None, "b", "a"], ["b", "b"]])
def test_detach_inputs_leaves_what_the_calls_leave(inputs: list[str | None]) -> None:
    states = []
    for detach in (fast_ir._detach_by_calls, fast_ir.detach_inputs):
        values = {"a": ir.Value(name="a"), "b": ir.Value(name="b")}
        keep = ir.Node("", "Add", [values["a"], values["b"]])
        node = ir.Node("", "Sum", [None if n is None else values[n] for n in inputs])
        detach(node)
        uses = {k: [(u.node is keep, u.idx) for u in v.uses()] for k, v in values.items()}
        states.append((node.inputs, uses))
    assert states[0] == states[1]
    assert states[1][0] == (None,) * len(inputs)
    assert states[1][1] == {"a": [(True, 0)], "b": [(True, 1)]}  # only the other node's


def test_the_detach_check_falls_back_to_the_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    def partial(node: ir.Node) -> None:  # leaves the last input attached
        for i in range(len(node.inputs) - 1):
            node.replace_input_with(i, None)

    monkeypatch.setattr(fast_ir, "_detach_direct", partial)
    assert fast_ir._checked_detach() is fast_ir._detach_by_calls


def _chain() -> tuple[ir.Graph, list[ir.Node]]:
    """x -> a = Neg(x) -> b = Abs(a) -> y = Relu(x): a and b are dead."""
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape([2]))
    a = ir.node("Neg", [x])
    b = ir.node("Abs", [a.outputs[0]])
    y = ir.node("Relu", [x])
    y.outputs[0].name = "y"
    graph = ir.Graph([x], [y.outputs[0]], nodes=[a, b, y], opset_imports={"": 18})
    return graph, [a, b, y]


@pytest.mark.parametrize("detached", [True, False])
def test_remove_detached_is_the_safe_removal(detached: bool) -> None:
    ours, (a, b, _) = _chain()
    theirs, (a2, b2, _) = _chain()
    if detached:
        for node in (a, b):
            fast_ir.detach_inputs(node)
    fast_ir.remove_detached(ours, [b, a])
    theirs.remove([b2, a2], safe=True)
    assert [n.op_type for n in ours] == [n.op_type for n in theirs] == ["Relu"]
    assert [len(v.uses()) for v in ours.inputs] == [len(v.uses()) for v in theirs.inputs] == [1]
    assert a.graph is None and b.graph is None and a.inputs == (None,)


@pytest.mark.parametrize("case", ["still_read", "graph_output", "foreign"])
def test_remove_detached_refuses_what_the_safe_removal_refuses(case: str) -> None:
    graph, (a, b, y) = _chain()
    other, _ = _chain()
    nodes = {"still_read": [a], "graph_output": [y], "foreign": [next(iter(other))]}[case]
    with pytest.raises(ValueError):
        fast_ir.remove_detached(graph, nodes)
    with pytest.raises(ValueError):
        graph.remove(nodes, safe=True)
    assert [n.op_type for n in graph] == ["Neg", "Abs", "Relu"]  # left as it was
    assert b.inputs == (a.outputs[0],)
