"""The fuzzer's graph description: values, kinks, nodes and the :class:`Spec` that renders them.

A graph is a :class:`Spec`: typed graph inputs, initializers and a list of :class:`Op` (one
ONNX text statement each, control flow included), rendered to ONNX text for either float type.
:mod:`fuzz_generator` draws them, :mod:`fuzzing` validates, checks and shrinks them.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import numpy as np

Dim = int | str
Shape = tuple[Dim, ...]
BATCH = "N"  # the symbolic (dynamic batch) dimension, always the leading axis of a value


@dataclasses.dataclass(frozen=True)
class Val:
    """A float value of the graph: its name, shape and whether every entry is > 0."""

    name: str
    shape: Shape
    positive: bool = False


@dataclasses.dataclass(frozen=True)
class Kink:
    """A point where an operator is not smooth: the sample point must keep away from it.

    ``kind`` is ``"abs"`` (``|a - o| > margin`` for every offset ``o`` in ``params``), ``"gap"``
    (``|a - b| > margin`` after broadcasting), ``"top"`` (the largest and smallest entries along
    the axes ``params`` are unique by a margin) or ``"pool"`` (the same over ``k x k`` windows,
    ``params = (k,)``).
    """

    kind: str
    values: tuple[str, ...]
    params: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class Op:
    """One node (its ONNX text), the values it reads (captured ones too) and the floats it makes."""

    text: str
    reads: tuple[str, ...]
    outs: tuple[Val, ...]
    kinks: tuple[Kink, ...] = ()


@dataclasses.dataclass(frozen=True)
class Const:
    """An initializer: ``dtype`` is ``"T"`` (the graph's float type), ``"int64"`` or ``"bool"``."""

    name: str
    dtype: str
    data: np.ndarray


@dataclasses.dataclass
class Spec:
    """A random graph, renderable in either float type."""

    seed: int
    opset: int
    dtype: str  # "float" or "double"
    batch: int  # the run-time size of N
    inputs: list[Val]
    flags: list[str]  # bool graph inputs (If conditions)
    consts: list[Const]
    ops: list[Op]
    outputs: list[str]
    constant_nodes: bool = False  # constants as Constant nodes (unnamed tensors), not initializers

    def values(self) -> dict[str, Val]:
        vals = {v.name: v for v in self.inputs}
        for op in self.ops:
            vals.update({v.name: v for v in op.outs})
        return vals

    def text(self, dtype: str | None = None, expose: bool = False) -> str:
        """ONNX text; ``expose`` makes every node output a graph output (for validation)."""
        t = dtype or self.dtype
        vals = self.values()
        outs = list(self.outputs)
        if expose:
            outs += [v.name for op in self.ops for v in op.outs if v.name not in outs]
        ins = [typed(t, v) for v in self.inputs] + [f"bool {f}" for f in self.flags]
        if self.constant_nodes:
            inits = ""
            lines = [
                f"{c.name} = Constant <value: tensor = {_tensor_text(t, c)}> ()"
                for c in self.consts
            ]
        else:
            inits = ", ".join(f"{_tensor_text(t, c, c.name)}" for c in self.consts)
            lines = []
        lines += [op.text.replace("{T}", t) for op in self.ops]
        body = "\n    ".join(lines)
        return (
            f'<ir_version: 10, opset_import: ["" : {self.opset}]>\n'
            f"fuzz ({', '.join(ins)}) => ({', '.join(typed(t, vals[o]) for o in outs)})\n"
            + (f"  <{inits}>\n" if inits else "")
            + f"{{\n    {body}\n}}\n"
        )

    def feeds(self, dtype: str | None = None) -> dict[str, np.ndarray]:
        """Input values, each seeded by the graph seed and its name (stable under shrinking)."""
        np_dtype = np.float32 if (dtype or self.dtype) == "float" else np.float64
        feeds: dict[str, np.ndarray] = {}
        for v in self.inputs:
            rng = np.random.default_rng([self.seed, zlib.crc32(v.name.encode())])
            shape = tuple(self.batch if d == BATCH else int(d) for d in v.shape)
            x = rng.uniform(0.5, 2.0, shape) if v.positive else rng.standard_normal(shape)
            feeds[v.name] = np.asarray(x, np_dtype)
        for f in self.flags:
            feeds[f] = np.array(zlib.crc32(f"{self.seed}{f}".encode()) % 2 == 0)
        return feeds


def typed(t: str, v: Val) -> str:
    return f"{t}[{','.join(str(d) for d in v.shape)}] {v.name}" if v.shape else f"{t} {v.name}"


def _tensor_text(t: str, c: Const, name: str = "") -> str:
    dtype = t if c.dtype == "T" else c.dtype
    flat = c.data.reshape(-1)
    if c.dtype == "T":
        items = ", ".join(f"{float(x):.6f}" for x in flat)
    else:
        items = ", ".join(str(int(x)) for x in flat)
    dims = f"[{','.join(str(d) for d in c.data.shape)}]" if c.data.ndim else ""
    return f"{dtype}{dims} {name + ' = ' if name else ''}{{{items}}}"


def broadcast(a: Shape, b: Shape) -> Shape | None:
    """numpy broadcasting with the symbolic N: N meets only N or 1."""
    out: list[Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


def ints_text(xs: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"
