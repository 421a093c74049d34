"""onnx_ir objects built without the conversions their constructors run on every element.

``ir.Shape(dims)`` passes each dimension through ``_maybe_convert_to_symbolic_dim`` (a chain
of ``isinstance`` and ``hasattr`` tests) and copies the list twice; the shape inference and
annotation of a derivative model build a shape or two per node, from dimensions that are
already what the conversion returns (numbers and ``SymbolicDim`` objects read off other
shapes), and those conversions were a thirtieth of a jvp. :func:`new_shape` builds the very
object ``ir.Shape`` builds, in place of its constructor, where the dimensions are known to be
so. Should onnx_ir's ``Shape`` keep other state, the module falls back to the constructor.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

__all__ = ["copy_shape", "new_shape"]

Dim = int | ir.SymbolicDim

_new = object.__new__


def _direct(dims: list[Dim]) -> ir.Shape:
    shape = _new(ir.Shape)
    # The attributes Shape.__init__ sets, given dimensions it would keep as they are.
    shape._dims = dims
    shape._denotations = [None] * len(dims)
    shape._frozen = False
    return shape


def _state(shape: ir.Shape) -> tuple[object, ...]:
    slots = tuple(getattr(shape, name) for name in ir.Shape.__slots__)
    return (slots, getattr(shape, "__dict__", None))


def _checked() -> Callable[[list[Dim]], ir.Shape]:
    """:func:`_direct` if it builds what the constructor builds, else the constructor."""
    dims: list[Dim] = [2, ir.SymbolicDim("N"), ir.SymbolicDim(None)]
    try:
        same = _state(_direct(list(dims))) == _state(ir.Shape(dims))
    except Exception:  # a Shape of another layout: the constructor is always right
        same = False
    return _direct if same else ir.Shape


_BUILD = _checked()


def new_shape(dims: list[Dim]) -> ir.Shape:
    """``ir.Shape(dims)`` for a list of ``int`` and ``SymbolicDim`` objects it may keep.

    Args:
        dims: The dimensions: exact ``int`` objects and ``ir.SymbolicDim`` objects only. The
            shape takes the list itself (the caller gives up its own).

    Returns:
        A new, unfrozen shape without denotations.
    """
    return _BUILD(dims)


def copy_shape(shape: ir.Shape) -> ir.Shape:
    """``shape.copy()``: a new, unfrozen shape of the same dimensions and denotations.

    A shape's dimensions are what the constructor's conversion keeps already; cloning a model
    copies a shape per value, and the conversion was a tenth of the copy.
    """
    if _BUILD is not _direct:
        return shape.copy()
    copy = _direct(list(shape._dims))
    copy._denotations = list(shape._denotations)
    return copy
