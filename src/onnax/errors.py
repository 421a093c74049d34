"""Exceptions raised by onnax.

Every error a user can reach says what failed, what was found against what was expected, and one
concrete remedy. The classes subclass the built-in exception a caller would naturally catch
(``ValueError`` for bad arguments, ``NotImplementedError`` for missing coverage), so no one has to
import this module just to handle an onnax failure.
"""

from __future__ import annotations

__all__ = [
    "CheckError",
    "InvalidModelError",
    "OnnaxError",
    "SelectionError",
    "UnsupportedOperatorError",
    "UnsupportedValueError",
]


class OnnaxError(Exception):
    """Base class of every error onnax raises on purpose."""


class SelectionError(OnnaxError, ValueError):
    """A selection of inputs or outputs names something that cannot be selected."""


class InvalidModelError(OnnaxError, ValueError):
    """The model given to a transform is not a valid ONNX model."""


class UnsupportedOperatorError(OnnaxError, NotImplementedError):
    """A derivative reaches an operator for which onnax has no rule."""


class UnsupportedValueError(OnnaxError, NotImplementedError):
    """A derivative reaches a value onnax cannot differentiate (sequences, optionals, samples)."""


class CheckError(OnnaxError, ValueError):
    """``onnax.check`` was given arguments it cannot check with (an unknown transform)."""
