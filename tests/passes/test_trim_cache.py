"""trim's fast path (no trailing empty input, a remembered schema without optional outputs).

The node is trimmed as onnx_ir's ``RemoveUnusedNodesPass`` trims it whether the schema's
answer is remembered already or not.
"""

from __future__ import annotations

import onnx_ir as ir
import pytest

from onnax.passes import fast_steps

_FLOAT = ir.TensorType(ir.DataType.FLOAT)


def _dropout() -> tuple[ir.Node, frozenset[ir.Value]]:
    """``y, mask = Dropout(x, None, None)``: a trailing empty input and an unread mask."""
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape([2]))
    node = ir.Node("", "Dropout", [x, None, None], num_outputs=2)
    node.outputs[0].name, node.outputs[1].name = "y", "mask"
    return node, frozenset([node.outputs[0]])


@pytest.mark.parametrize("remembered", [False, True])
def test_trim_removes_what_the_pass_removes(remembered: bool) -> None:
    if remembered:
        node, outputs = _dropout()
        fast_steps.trim(node, outputs, 18)  # the schema's answer is now remembered
        assert fast_steps._OPTIONAL_OUTPUTS[("Dropout", 18, "")]
    else:
        fast_steps._OPTIONAL_OUTPUTS.pop(("Dropout", 18, ""), None)
    node, outputs = _dropout()
    fast_steps.trim(node, outputs, 18)
    assert list(node.inputs) == [node.inputs[0]] and node.inputs[0] is not None
    assert [v.name for v in node.outputs] == ["y"]


def test_a_schema_without_optional_outputs_is_remembered_so() -> None:
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape([2]))
    node = ir.Node("", "Relu", [x])
    fast_steps.trim(node, frozenset(node.outputs), 18)
    assert fast_steps._OPTIONAL_OUTPUTS[("Relu", 18, "")] is False
    # Passed over from now on, and left as it is.
    again = ir.Node("", "Relu", [x])
    fast_steps.trim(again, frozenset(), 18)
    assert len(again.outputs) == 1 and list(again.inputs) == [x]
