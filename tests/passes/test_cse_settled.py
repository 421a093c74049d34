"""CSE tells whether a second run would find nothing, and the cleanup skips that run then."""

from __future__ import annotations

import glob
import os

import onnx_ir as ir
import pytest

import onnax
from onnax.passes import cleanup, cse

DATA = os.path.join(os.path.dirname(__file__), "..", "data")

_FLOAT = ir.TensorType(ir.DataType.FLOAT)


def _graph(order: list[int], outputs: str = "s") -> ir.Graph:
    """``Sin(x)`` twice, a ``Mul`` of each with ``x`` and their sum, placed in ``order``.

    The graph's outputs are the sum (``"s"``) or the two ``Sin`` (``"a"``).
    """
    x = ir.Value(name="x", type=_FLOAT, shape=ir.Shape([3]))
    a1, a2 = ir.node("Sin", [x]), ir.node("Sin", [x])
    m1 = ir.node("Mul", [a1.outputs[0], x])
    m2 = ir.node("Mul", [a2.outputs[0], x])
    s = ir.node("Add", [m1.outputs[0], m2.outputs[0]])
    nodes = [a1, a2, m1, m2, s]
    outs = [s.outputs[0]] if outputs == "s" else [a1.outputs[0], a2.outputs[0]]
    for i, v in enumerate(outs):
        v.name = f"y{i}"
    return ir.Graph([x], outs, nodes=[nodes[i] for i in order], opset_imports={"": 18})


def test_a_sorted_graph_is_settled_after_one_run() -> None:
    graph = _graph([0, 1, 2, 3, 4])
    assert cse.eliminate(graph) == (True, True)
    assert [n.op_type for n in graph] == ["Sin", "Mul", "Add"]
    assert cse.eliminate(graph) == (False, True)  # what "settled" promises


def test_a_duplicate_read_by_a_node_keyed_before_it_is_not_settled() -> None:
    # The Muls come first: they are keyed on the two Sins' outputs, which merge only later,
    # so the Muls become equal after their keys were made, and a second run merges them.
    graph = _graph([2, 3, 0, 1, 4])
    removed, settled = cse.eliminate(graph)
    assert removed and not settled
    assert cse.eliminate(graph)[0]


def test_an_identity_added_for_an_output_is_not_settled() -> None:
    graph = _graph([0, 1, 2, 3, 4], outputs="a")
    removed, settled = cse.eliminate(graph)
    assert removed and not settled
    assert "Identity" in [n.op_type for n in graph]


def _models() -> list[str]:
    return sorted(glob.glob(os.path.join(DATA, "*.onnx")))


@pytest.mark.parametrize("path", _models(), ids=os.path.basename)
@pytest.mark.parametrize("transform", ["jvp", "vjp"])
def test_cleanup_skipping_the_confirming_cse_changes_nothing(
    path: str, transform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleanup's result is the one it gives running every round's CSE (the slow path)."""
    model = ir.load(path)
    fast = getattr(onnax, transform)(model)
    skipped: list[bool] = []
    call = cleanup.FixedPoint.call

    def unsettled(self: cleanup.FixedPoint, m: ir.Model) -> ir.passes.PassResult:
        if self.settled is not None:
            skipped.append(self.settled())
        self.settled = None
        return call(self, m)

    monkeypatch.setattr(cleanup.FixedPoint, "call", unsettled)
    slow = getattr(onnax, transform)(model)
    assert ir.to_proto(fast).SerializeToString() == ir.to_proto(slow).SerializeToString()
    assert skipped


def test_the_skip_happens_on_a_derivative_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # Guards the comparison above against a cleanup that never finds the model settled.
    runs: list[bool] = []
    call = cleanup.EliminateCommonSubexpressions.call

    def counted(self: cleanup.EliminateCommonSubexpressions, m: ir.Model) -> ir.passes.PassResult:
        runs.append(True)
        return call(self, m)

    monkeypatch.setattr(cleanup.EliminateCommonSubexpressions, "call", counted)
    onnax.jvp(ir.load(os.path.join(DATA, "torch_mlp.onnx")))
    assert len(runs) == 1  # the confirming run after an unchanged simplification is skipped
