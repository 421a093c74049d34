"""Shape and layout operators: Expand (more to come: Reshape Flatten Transpose Squeeze Unsqueeze
Concat Split Slice Pad Tile Constant ConstantOfShape Range)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.registry import jvp_rules, transpose_rules
from onnax.core.shapes import unbroadcast

Tangents = Sequence[ir.Value | None]


# -------------------------------------------------------------------------------- Expand
@jvp_rules.register("Expand", since_version=8)
def _expand_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    return [None if t is None else em.op("Expand", [t, node.inputs[1]])]


@transpose_rules.register("Expand", since_version=8)
def _expand_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> list[ir.Value | None]:
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    return [unbroadcast(em, ct, x, node.outputs[0]), None]
