"""Completion's later rounds infer only what folding reached, and find what full rounds find.

The oracle is the same completion with every later round inferring every node (as before the
rounds were limited): both must serialise to the same bytes, on the TorchScript mask pattern
that needs a later round (an ``Expand`` to a folded ``Where`` of constants) and on the zoo's
batch-normalized convolution, whose folded scale feeds a ``Mul`` of activations.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
import pytest

import onnax.core.shape_fill as shape_fill
from onnax.core.inference import infer_shapes
from test_shape_completion import HEADER, TORCHSCRIPT_EXPAND

BN_CONV = """
g (float[N, 2, 5, 5] x) => (float[N, 3, 5, 5] y) {
    w = Constant <value = float[3, 2, 1, 1] {1, 2, 3, 4, 5, 6}> ()
    s = Constant <value = float[3] {1, 2, 3}> ()
    eps = Constant <value = float {0.001}> ()
    axes = Constant <value = int64[2] {1, 2}> ()
    c = Conv (x, w)
    v = Add (s, eps)
    r = Sqrt (v)
    k = Unsqueeze (r, axes)
    m = Mul (c, k)
    y = Relu (m)
}
"""


@pytest.mark.parametrize("text", [TORCHSCRIPT_EXPAND, BN_CONV], ids=["torchscript", "bn_conv"])
def test_a_later_round_finds_what_a_full_round_finds(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    limited, full = ir.from_onnx_text(HEADER + text), ir.from_onnx_text(HEADER + text)
    passed_over: list[int] = []
    unaffected = shape_fill._unaffected

    def spy(model: ir.Model, changed: set[ir.Value]) -> Sequence[ir.Node]:
        nodes = unaffected(model, changed)
        passed_over.append(len(nodes))
        return nodes

    monkeypatch.setattr(shape_fill, "_unaffected", spy)
    infer_shapes(limited)
    assert passed_over and max(passed_over) > 0  # a later round ran and passed over nodes
    monkeypatch.setattr(shape_fill, "_unaffected", lambda model, changed: [])
    infer_shapes(full)
    assert ir.to_proto(limited).SerializeToString() == ir.to_proto(full).SerializeToString()
