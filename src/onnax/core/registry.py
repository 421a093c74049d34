"""Rule registries keyed by ``(domain, op_type)`` with ``since_version`` dispatch.

A rule registered with ``since_version=v`` serves every opset from ``v`` up to (excluding) the
next registered version of the same operator, exactly as ONNX schemas are versioned. Operators
whose semantics changed (ReduceSum moving ``axes`` to an input at 13, say) register once per
version that matters.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, TypeAlias, TypeVar

import onnx_ir as ir

if TYPE_CHECKING:
    from onnax.core.batching import Batcher
    from onnax.core.emit import Emitter

__all__ = [
    "BatchRule",
    "JvpRule",
    "LoweringRule",
    "Registry",
    "TransposeRule",
    "batch_rules",
    "jvp_rules",
    "lowerings",
    "transpose_rules",
]

Tangents: TypeAlias = Sequence["ir.Value | None"]

JvpRule: TypeAlias = Callable[["Emitter", ir.Node, Tangents], Tangents]
"""``(emitter, node, input tangents) -> output tangents``; ``None`` is a symbolic zero."""

TransposeRule: TypeAlias = Callable[["Emitter", ir.Node, Tangents, Sequence[bool]], Tangents]
"""``(emitter, linear node, output cotangents, which inputs are linear) -> input cotangents``."""

Batched: TypeAlias = Sequence[bool]

BatchRule: TypeAlias = Callable[
    ["Batcher", ir.Node, Sequence["ir.Value | None"], Batched],
    tuple[Sequence["ir.Value | None"], Batched],
]
"""``(batcher, node, new inputs, which are batched) -> (new outputs, which are batched)``.

Batched values carry the batch dimension at axis 0; ``node`` is the original (unbatched) node,
whose inputs and outputs keep their inferred unbatched shapes for the rule to read."""

LoweringRule: TypeAlias = Callable[["Emitter", ir.Node], Sequence["ir.Value | None"]]
"""``(emitter, node) -> replacement outputs``.

A lowering emits primitive nodes (through the emitter) that compute every output of ``node``
from its inputs, and returns the values replacing its outputs (``None`` for an output that is
absent or unused). Expansion (:mod:`onnax.passes.expand`) applies it to a node that has no rule
for the transform at hand, so that operators like LSTM or GridSample are covered by the rules of
the primitives they lower to. A rule registered for the operator itself takes precedence."""

R = TypeVar("R")


class Registry(Generic[R]):
    """Rules of one kind, dispatched by operator and opset version.

    Args:
        kind: A short name for messages ("jvp", "transpose", "batch").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._rules: dict[tuple[str, str], list[tuple[int, R]]] = {}

    def register(
        self, op_type: str, *, domain: str = "", since_version: int = 1
    ) -> Callable[[R], R]:
        """Returns a decorator registering a rule for ``op_type`` from ``since_version`` on."""

        def decorate(rule: R) -> R:
            self.add(op_type, rule, domain=domain, since_version=since_version)
            return rule

        return decorate

    def add(self, op_type: str, rule: R, *, domain: str = "", since_version: int = 1) -> None:
        """Registers ``rule`` for ``op_type`` from ``since_version`` on, replacing an equal key."""
        entries = self._rules.setdefault((domain, op_type), [])
        entries[:] = [e for e in entries if e[0] != since_version]
        bisect.insort(entries, (since_version, rule), key=lambda e: e[0])

    def lookup(self, domain: str, op_type: str, opset: int) -> R | None:
        """The rule serving ``domain::op_type`` at ``opset``, or None."""
        entries = self._rules.get((domain, op_type))
        if not entries:
            return None
        i = bisect.bisect_right([v for v, _ in entries], opset)
        return entries[i - 1][1] if i else None

    def oldest_version(self, domain: str, op_type: str) -> int | None:
        """The smallest ``since_version`` registered for the operator, or None."""
        entries = self._rules.get((domain, op_type))
        return entries[0][0] if entries else None

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._rules

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(sorted(self._rules))


jvp_rules: Registry[JvpRule] = Registry("jvp")
transpose_rules: Registry[TransposeRule] = Registry("transpose")
batch_rules: Registry[BatchRule] = Registry("batch")
lowerings: Registry[LoweringRule] = Registry("lowering")
