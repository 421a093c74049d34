"""onnax.passes.fast_steps leaves the model that onnx_ir's own steps leave, byte for byte."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common
import pytest

from onnax.passes import cse, fast_steps
from onnax.passes.cleanup import PruneNodes, RemoveDeadNodes
from onnax.passes.steps import Steps

DATA = os.path.join(os.path.dirname(__file__), "data")

# Dead nodes at the top and inside a body, unused optional outputs (Dropout's mask, the running
# statistics of a BatchNormalization in inference mode, LSTM's Y_c), a used optional output that
# must stay, trailing empty inputs, an unused initializer and a variadic-output Split.
DEAD_AND_OPTIONAL = """
<ir_version: 8, opset_import: ["" : 15]>
g (float[2, 3, 4] x, bool c) => (float[2, 3, 4] y, float[2, 3, 4] m_out, float[1, 2, 5] h)
  <float[3] s = {1, 1, 1}, float[3] b = {0, 0, 0}, float[3] mean = {0, 0, 0},
   float[3] var = {1, 1, 1}, float[1] unused = {5},
   float[1, 20, 4] w = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
                        0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0},
   float[1, 20, 5] r = {0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
                        0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
                        0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}> {
    d, mask = Dropout (x)
    n, rm, rv = BatchNormalization <training_mode = 0> (d, s, b, mean, var)
    m_out, m_mask = Dropout (n)
    dead = Neg (x)
    parts_a, parts_b = Split <num_outputs = 2> (x)
    k = If (c) <
        then_branch = t () => (float[2, 3, 4] o) { gone = Abs (x)  o = Relu (x) },
        else_branch = e () => (float[2, 3, 4] q) { q = Sigmoid (x) }
    >
    y = Add (k, m_out)
    seq = Transpose <perm = [1, 0, 2]> (x)
    all_h, h, cell = LSTM <hidden_size = 5> (seq, w, r, , , , )
}
"""


def _models() -> list[tuple[str, ir.Model]]:
    models = [("dead_and_optional", ir.from_onnx_text(DEAD_AND_OPTIONAL))]
    for path in sorted(glob.glob(os.path.join(DATA, "*.onnx"))):
        models.append((os.path.basename(path), ir.load(path)))
    return models


def _bytes(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString()


@pytest.mark.parametrize(
    ("name", "model"), _models(), ids=lambda p: p if isinstance(p, str) else ""
)
def test_remove_unused_nodes_is_onnx_irs(name: str, model: ir.Model) -> None:
    reference = ir.from_proto(ir.to_proto(model))
    ours = ir.from_proto(ir.to_proto(model))
    expected = common.RemoveUnusedNodesPass()(reference)
    result = fast_steps.RemoveUnusedNodes()(ours)
    assert result.modified == expected.modified
    assert _bytes(ours) == _bytes(reference)


def test_the_example_has_something_to_remove() -> None:
    # Guards the comparison above against an example where both passes do nothing.
    model = ir.from_onnx_text(DEAD_AND_OPTIONAL)
    before = sum(1 for g in model.graphs() for _ in g)
    outputs_before = sum(len(n.outputs) for n in model.graph)
    assert fast_steps.RemoveUnusedNodes()(model).modified
    assert sum(1 for g in model.graphs() for _ in g) < before
    assert sum(len(n.outputs) for n in model.graph) < outputs_before
    assert "unused" not in model.graph.initializers
    lstm = next(n for n in model.graph if n.op_type == "LSTM")
    assert [o.name for o in lstm.outputs] == ["", "h"]  # Y dropped (unused), Y_h kept


def test_sort_graph_is_onnx_irs() -> None:
    model, reference = ir.from_onnx_text(DEAD_AND_OPTIONAL), ir.from_onnx_text(DEAD_AND_OPTIONAL)
    for m in (model, reference):
        m.graph.extend(reversed(list(m.graph)))  # re-appending moves: the order is reversed
    fast_steps.SortGraph()(model)
    reference.graph.sort()
    assert _bytes(model) == _bytes(reference)


# Duplicates of every kind CSE meets: chains that merge only once their inputs merged, a
# duplicate graph output whose twin is an output too (an Identity keeps it) or a plain value
# (the twin takes the output's name), equal small Constants, 11-element ones (apart under onnx_ir's
# size limit, merged under ours) and random nodes
# that must stay, attribute lists compared by value, and an If that is never merged.
DUPLICATES = """
<ir_version: 8, opset_import: ["" : 18]>
g (float[2, 3] x, bool c) => (float[2, 3] y1, float[2, 3] y2, float[2, 3] z2, float[3, 2] t2,
                              float[2, 3] k1, float[2, 3] k2)
{
    a1 = Sin (x)
    a2 = Sin (x)
    b1 = Mul (a1, x)
    b2 = Mul (a2, x)
    y1 = Exp (b1)
    y2 = Exp (b2)
    z1 = Cos (b1)
    z2 = Cos (b2)
    w = Add (z1, x)
    t1 = Transpose <perm = [1, 0]> (w)
    t2 = Transpose <perm = [1, 0]> (w)
    u = Transpose <perm = [1, 0]> (t1)
    one1 = Constant <value = float[1] {1}> ()
    one2 = Constant <value = float[1] {1}> ()
    big1 = Constant <value = float[11] {1,1,1,1,1,1,1,1,1,1,1}> ()
    big2 = Constant <value = float[11] {1,1,1,1,1,1,1,1,1,1,1}> ()
    r1 = RandomUniformLike (x)
    r2 = RandomUniformLike (x)
    s1 = Add (one1, big1)
    s2 = Add (one2, big2)
    v = Sum (u, r1, r2)
    k1 = If (c) <
        then_branch = t () => (float[2, 3] o) { o = Relu (x) },
        else_branch = e () => (float[2, 3] q) { q = Neg (x) }
    >
    k2 = If (c) <
        then_branch = t2 () => (float[2, 3] o2) { o2 = Relu (x) },
        else_branch = e2 () => (float[2, 3] q2) { q2 = Neg (x) }
    >
}
"""


def _cse_models() -> list[tuple[str, ir.Model]]:
    return [("duplicates", ir.from_onnx_text(DUPLICATES)), *_models()]


@pytest.mark.parametrize(
    ("name", "model"), _cse_models(), ids=lambda p: p if isinstance(p, str) else ""
)
def test_cse_is_onnx_irs(name: str, model: ir.Model) -> None:
    reference = ir.from_proto(ir.to_proto(model))
    ours = ir.from_proto(ir.to_proto(model))
    expected = common.CommonSubexpressionEliminationPass()(reference)
    modified = cse.eliminate_common_subexpressions(ours.graph, size_limit=10)  # onnx_ir's limit
    assert modified == expected.modified
    assert _bytes(ours) == _bytes(reference)


def test_the_cse_example_has_something_to_merge() -> None:
    # Guards the comparison above against an example where both do nothing or too little.
    model = ir.from_onnx_text(DUPLICATES)
    before = {n.op_type: 0 for n in model.graph}
    for n in model.graph:
        before[n.op_type] += 1
    assert cse.eliminate_common_subexpressions(model.graph)
    after = {n.op_type: 0 for n in model.graph}
    for n in model.graph:
        after[n.op_type] += 1
    assert after["Sin"] == after["Mul"] == after["Cos"] == 1
    assert after["Exp"] == 1 and after["Identity"] == 1  # y2 is y1, kept apart by an Identity
    assert after["Transpose"] == 2  # t1 = t2 merged, the transpose of t1 stays
    # the ones merged, and the 11-element ones too (onnx_ir's limit keeps them apart, ours not)
    assert after["Constant"] == 2
    assert after["RandomUniformLike"] == 2 and after["If"] == 2
    assert [v.name for v in model.graph.outputs] == ["y1", "y2", "z2", "t2", "k1", "k2"]


def _constants_model(a: np.ndarray, b: np.ndarray) -> ir.Model:
    """y = (x + a) * (x + b), a and b as Constant nodes."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(a.shape))
    ca = ir.node("Constant", [], {"value": ir.tensor(a)})
    cb = ir.node("Constant", [], {"value": ir.tensor(b)})
    sa = ir.node("Add", [x, ca.outputs[0]])
    sb = ir.node("Add", [x, cb.outputs[0]])
    y = ir.node("Mul", [sa.outputs[0], sb.outputs[0]])
    y.outputs[0].name = "y"
    graph = ir.Graph([x], [y.outputs[0]], nodes=[ca, cb, sa, sb, y], opset_imports={"": 17})
    return ir.Model(graph, ir_version=8)


@pytest.mark.parametrize("size", [11, 1000, cse.SIZE_LIMIT])
def test_cse_merges_equal_constants_beyond_onnx_irs_limit(size: int) -> None:
    # A second transform re-emits the first one's constants; equal ones must merge, and so
    # must what is computed from them (here the two Adds).
    a = np.arange(size, dtype=np.float32)
    model = _constants_model(a, a.copy())
    assert cse.eliminate_common_subexpressions(model.graph)
    assert [n.op_type for n in model.graph] == ["Constant", "Add", "Mul"]


def test_cse_keeps_constants_that_differ_or_are_too_large() -> None:
    a = np.arange(1000, dtype=np.float32)
    b = a.copy()
    b[-1] += 1  # one element differs
    model = _constants_model(a, b)
    assert not cse.eliminate_common_subexpressions(model.graph)
    big = np.zeros(cse.SIZE_LIMIT + 1, np.float32)
    model = _constants_model(big, big.copy())
    assert not cse.eliminate_common_subexpressions(model.graph)


@pytest.mark.parametrize(
    ("name", "model"), _models(), ids=lambda p: p if isinstance(p, str) else ""
)
def test_prune_is_the_two_steps_in_turn(name: str, model: ir.Model) -> None:
    # Also on the graph reversed (not sorted, as a transform may leave it before cleanup):
    # a dead consumer placed before its producer frees the producer's optional output.
    for reverse in (False, True):
        reference = ir.from_proto(ir.to_proto(model))
        ours = ir.from_proto(ir.to_proto(model))
        for graph in (reference.graph, ours.graph) if reverse else ():
            nodes = list(graph)
            graph.remove(nodes)
            graph.extend(reversed(nodes))
        expected = Steps(RemoveDeadNodes(), fast_steps.RemoveUnusedNodes())(reference)
        result = PruneNodes()(ours)
        assert result.modified == expected.modified
        assert _bytes(ours) == _bytes(reference)


def test_prune_trims_like_the_second_step_after_a_dead_consumer() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 15]>
    g (float[2] x) => (float[2] y) {
        y, mask = Dropout (x)
    }
    """
    model = ir.from_onnx_text(text)
    dropout = next(iter(model.graph))
    dead = ir.node("Not", [dropout.outputs[1]])
    model.graph.insert_before(dropout, dead)  # before its producer: a graph not sorted
    PruneNodes()(model)
    assert [n.op_type for n in model.graph] == ["Dropout"]
    assert len(dropout.outputs) == 1  # the mask went once its dead reader had gone
