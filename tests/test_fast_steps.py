"""onnax.passes.fast_steps leaves the model that onnx_ir's own steps leave, byte for byte."""

from __future__ import annotations

import glob
import os

import onnx_ir as ir
import onnx_ir.passes.common as common
import pytest

from onnax.passes import fast_steps

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
