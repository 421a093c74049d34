"""What every subcommand shares: progress, argument parsing helpers, reading and writing files."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnax.errors import OnnaxError

__all__ = [
    "CliError",
    "Progress",
    "has_external_data",
    "load",
    "names",
    "parse_axes",
    "parse_dims",
    "refuse_overwrite",
    "save",
]


class CliError(OnnaxError):
    """A bad command-line argument (an unreadable file, a malformed axis list)."""


class Progress:
    """One line of progress on stderr, rewritten in place when stderr is a terminal."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._open = False

    def __call__(self, message: str) -> None:
        """Shows ``message`` with the elapsed time."""
        if self.quiet:
            return
        line = f"onnax [{time.perf_counter() - self.start:6.1f}s] {message}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
            self._open = True
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        """Ends a line left open on a terminal."""
        if self._open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._open = False


def names(text: str | None) -> list[str] | None:
    """A comma-separated list of names (None stays None)."""
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def _axis(text: str) -> int | None:
    text = text.strip()
    if text.lower() in ("none", "null", "-", ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise CliError(f"an axis must be an integer or None, got {text!r}") from None


def parse_axes(text: str | None) -> Any:
    """``--in-axes``/``--out-axes``: ``0``, ``0,None`` (by position) or ``x=0,w=None`` (by name)."""
    if text is None:
        return 0
    parts = [p for p in text.split(",") if p.strip()]
    if any("=" in p for p in parts):
        if not all("=" in p for p in parts):
            raise CliError(f"mix of named and positional axes in {text!r}; use one form")
        return {k.strip(): _axis(v) for k, v in (p.split("=", 1) for p in parts)}
    if len(parts) == 1:
        return _axis(parts[0])
    return tuple(_axis(p) for p in parts)


def parse_dims(items: Sequence[str] | None) -> dict[str, int | None] | None:
    """``--dim N=4`` (bind) or ``--dim N=symbolic`` (keep); repeatable."""
    if not items:
        return None
    dims: dict[str, int | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"--dim takes NAME=SIZE or NAME=symbolic, got {item!r}")
        if value.strip().lower() in ("symbolic", "none", "keep"):
            dims[name.strip()] = None
        else:
            try:
                dims[name.strip()] = int(value)
            except ValueError:
                raise CliError(
                    f"--dim {item!r}: the size must be an integer or 'symbolic'"
                ) from None
    return dims


def load(path: str) -> ir.Model:
    """Reads a model, with a message that says why when the file is not one."""
    if not Path(path).is_file():
        raise CliError(f"no such file: {path}")
    try:
        return ir.load(path)
    except Exception as err:
        duplicate = _duplicate_value(path)
        if duplicate is not None:
            name, graph = duplicate
            raise CliError(
                f"cannot read {path}: the value name {name!r} is defined twice in graph "
                f"{graph!r} (ONNX is single assignment: every node output, graph input and "
                "initializer needs its own name). Rename one of the two definitions."
            ) from err
        raise CliError(f"cannot read {path} as an ONNX model: {err}") from err


def _duplicate_value(path: str) -> tuple[str, str] | None:
    """The first value name defined twice in a graph of the file, and that graph's name.

    onnx_ir refuses such a model with a message that names neither; the protobuf, read without
    its weights, says which.
    """
    import onnx

    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception:
        return None
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        seen: set[str] = set()
        defined = [
            *(v.name for v in graph.input),
            *(t.name for t in graph.initializer if t.name not in {v.name for v in graph.input}),
            *(out for node in graph.node for out in node.output if out),
        ]
        for name in defined:
            if name in seen:
                return name, graph.name
            seen.add(name)
        for node in graph.node:
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else [])
                graphs.extend(attr.graphs)
    return None


def refuse_overwrite(source: str, results: Sequence[Path]) -> None:
    """Refuses a result path that is the source file: the source would be lost."""
    src = Path(source).resolve()
    for result in results:
        if result.resolve() == src:
            raise CliError(
                f"the result {str(result)!r} is the input model {source!r}: writing it would "
                "overwrite the source. Give the result another file name."
            )


def has_external_data(model: ir.Model) -> bool:
    """Whether an initializer of ``model`` keeps its data in an external file."""
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


def save(model: ir.Model, source: ir.Model, path: str) -> None:
    """Writes ``model``; with external data beside it when the source kept its weights there.

    The result shares the source's weight tensors, whose external references are relative to
    the source's folder: saved as they are, they would point nowhere from another folder, and
    saved inline they could exceed protobuf's 2 GB.
    """
    if has_external_data(source):
        ir.save(model, path, external_data=Path(path).name + ".data")
    else:
        ir.save(model, path)
