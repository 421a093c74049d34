"""The fast test of forget_guessed_broadcasts agrees with its axis by axis look."""

from __future__ import annotations

import random

import onnx_ir as ir

from onnax.core import broadcast_dims


def _padded(shapes: list[ir.Shape], rank: int) -> list[list[broadcast_dims.Dim]]:
    return [[*([1] * (rank - s.rank())), *s.dims] for s in shapes]


def test_sound_everywhere_only_where_every_axis_is_sound() -> None:
    rng = random.Random(0)
    n, m = ir.SymbolicDim("N"), ir.SymbolicDim("M")
    pool: list[object] = [1, 1, 2, 3, n, n, m, ir.SymbolicDim("N"), None]
    fast = 0
    for _ in range(3000):
        count = rng.randint(1, 3)
        shapes = [
            ir.Shape([rng.choice(pool) for _ in range(rng.randint(0, 3))])  # type: ignore[misc]
            for _ in range(count)
        ]
        if rng.random() < 0.3:  # one shape, shared: the commonest case
            shapes = [shapes[0]] * count
        rank = max(s.rank() for s in shapes)
        sound = all(
            broadcast_dims._sound_dim([p[axis] for p in _padded(shapes, rank)]) is not None
            for axis in range(rank)
        )
        if broadcast_dims._sound_everywhere(list(shapes)):
            fast += 1
            assert sound, shapes
    assert fast > 300  # the fast test does decide often
