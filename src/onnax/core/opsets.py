"""The default-domain opsets onnax serves."""

from __future__ import annotations

import onnx.defs

__all__ = ["DEFAULT_OPSET", "MAX_OPSET", "MIN_OPSET"]

MIN_OPSET = 11
"""The oldest default-domain opset the rules serve; older models are converted to it first."""

MAX_OPSET = onnx.defs.onnx_opset_version()
"""The newest opset the installed onnx package knows."""

DEFAULT_OPSET = 21
"""The default-domain opset given to a model that imports none."""
