"""Pausing Python's cyclic garbage collector while a transform runs.

A transform allocates tens of thousands of small onnx_ir objects (nodes, values, attributes,
shapes) while the model it works on stays alive. Each allocation burst triggers collections,
and the oldest generation's collections walk the whole model again and again: a third of a
reverse-mode transform on a thousand-node model went there. The objects a transform drops are
few next to the ones it keeps, so collecting once afterwards loses nothing.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["gc_paused"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def gc_paused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Wraps ``fn`` so that the cyclic collector is disabled while it runs.

    The collector is re-enabled afterwards only if it was enabled before, so that nested calls
    and callers that disabled it themselves keep their setting.
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return wrapper
