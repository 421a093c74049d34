"""Rule registries keyed by ``(domain, op_type)`` with ``since_version`` dispatch.

A rule registered with ``since_version=v`` serves every opset from ``v`` up to (excluding) the
next registered version of the same operator, exactly as ONNX schemas are versioned. Operators
whose semantics changed (ReduceSum moving ``axes`` to an input at 13, say) register once per
version that matters, and only those: a later schema version with the same semantics is served
by the earlier registration.

Rule modules register through one form, :class:`OpRules`: an object per operator (or group of
operators sharing rules) whose ``.jvp``, ``.transpose``, ``.batch`` and ``.lowering`` decorators
put the rules beside it::

    reshape = OpRules("Reshape", since=5)

    @reshape.jvp
    def _reshape_jvp(em, node, tangents): ...

    @reshape.batch(since=14)  # a rule for a later version only
    def _reshape_batch(bx, node, args, batched): ...

Registering the same ``(domain, op_type, since_version)`` twice raises
:class:`DuplicateRuleError`: a later registration never silently replaces an earlier one.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, Generic, TypeAlias, TypeVar, overload

import onnx_ir as ir

if TYPE_CHECKING:
    from onnax.core.batching import Batcher
    from onnax.core.emit import Emitter

__all__ = [
    "Args",
    "BatchResult",
    "BatchRule",
    "DuplicateRuleError",
    "OpRules",
    "PartialJvp",
    "Tangents",
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
"""One tangent (or cotangent) per input or output; ``None`` is a symbolic zero."""

Args: TypeAlias = Sequence["ir.Value | None"]
"""A batch rule's new inputs, one per input of the original node (``None``: absent)."""

BatchResult: TypeAlias = tuple[list["ir.Value | None"], list[bool]]
"""What a batch rule returns: the new outputs and which of them carry the batch axis."""

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

PartialJvp: TypeAlias = Callable[["Emitter", ir.Node, ir.Value], ir.Value]
"""``(emitter, node, tangent of one input) -> its contribution to the tangent of output 0``.

The per-input form of a jvp rule (JAX's ``defjvp``): :meth:`OpRules.defjvp` sums the
contributions of the inputs whose tangent is not a symbolic zero."""

R = TypeVar("R")


class DuplicateRuleError(ValueError):
    """A rule was registered twice for the same operator and ``since_version``."""


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
        """Registers ``rule`` for ``op_type`` from ``since_version`` on.

        Raises:
            DuplicateRuleError: A rule is already registered at that key.
        """
        entries = self._rules.setdefault((domain, op_type), [])
        if any(v == since_version for v, _ in entries):
            label = f"{domain}::{op_type}" if domain else op_type
            raise DuplicateRuleError(
                f"{self.kind} rule for {label} since_version {since_version} is already "
                f"registered; each (operator, version) has one rule: remove one of the two "
                f"registrations, or register the new one for the version where it differs"
            )
        bisect.insort(entries, (since_version, rule), key=lambda e: e[0])

    def entries(self, domain: str, op_type: str) -> list[tuple[int, R]]:
        """The ``(since_version, rule)`` pairs of the operator, oldest first (a copy)."""
        return list(self._rules.get((domain, op_type), []))

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


class OpRules:
    """The rules of one operator (or of operators sharing them), registered in one block.

    Args:
        op_type: The operator, or several operators that share every rule of the block
            (``("Squeeze", "Unsqueeze")``).
        since: The ``since_version`` a rule serves from when its decorator names none, or the
            versions whose semantics matter to the rules (``(5, 14)``): bare decorators register
            at the first, and ``since=`` of a decorator must be one of them.
        domain: The operator's domain ("" for ONNX).
    """

    def __init__(
        self, op_type: str | Sequence[str], since: int | Sequence[int] = 1, *, domain: str = ""
    ) -> None:
        self.op_types: tuple[str, ...] = (op_type,) if isinstance(op_type, str) else tuple(op_type)
        self.versions: tuple[int, ...] = (since,) if isinstance(since, int) else tuple(since)
        if not self.op_types or not self.versions:
            raise ValueError("OpRules needs at least one operator and one version")
        if list(self.versions) != sorted(set(self.versions)):
            raise ValueError(f"OpRules versions must increase: {self.versions}")
        self.domain = domain
        # Which module declares the block: the house rules keep each operator's rules in one.
        module = sys._getframe(1).f_globals.get("__name__", "?")
        for op in self.op_types:
            OpRules._owners.setdefault((domain, op), set()).add(module)

    _owners: ClassVar[dict[tuple[str, str], set[str]]] = {}

    @staticmethod
    def owners() -> dict[tuple[str, str], set[str]]:
        """``{(domain, op_type): modules declaring an OpRules block for it}`` (a copy)."""
        return {key: set(mods) for key, mods in OpRules._owners.items()}

    def _version(self, since: int | None) -> int:
        if since is None:
            return self.versions[0]
        if len(self.versions) > 1 and since not in self.versions:
            raise ValueError(
                f"{'/'.join(self.op_types)}: since={since} is not among the versions "
                f"{self.versions} declared to matter"
            )
        if since < self.versions[0]:
            raise ValueError(
                f"{'/'.join(self.op_types)}: since={since} precedes the first version "
                f"{self.versions[0]}"
            )
        return since

    def _decorator(self, registry: Registry[R], rule: R | None, since: int | None) -> object:
        version = self._version(since)

        def decorate(r: R) -> R:
            for op in self.op_types:
                registry.add(op, r, domain=self.domain, since_version=version)
            return r

        return decorate if rule is None else decorate(rule)

    @overload
    def jvp(self, rule: JvpRule, *, since: int | None = None) -> JvpRule: ...
    @overload
    def jvp(
        self, rule: None = None, *, since: int | None = None
    ) -> Callable[[JvpRule], JvpRule]: ...
    def jvp(
        self, rule: JvpRule | None = None, *, since: int | None = None
    ) -> JvpRule | Callable[[JvpRule], JvpRule]:
        """Registers a jvp rule: ``@ops.jvp``, ``@ops.jvp(since=13)`` or ``ops.jvp(rule)``."""
        return self._decorator(jvp_rules, rule, since)  # type: ignore[return-value]

    @overload
    def transpose(self, rule: TransposeRule, *, since: int | None = None) -> TransposeRule: ...
    @overload
    def transpose(
        self, rule: None = None, *, since: int | None = None
    ) -> Callable[[TransposeRule], TransposeRule]: ...
    def transpose(
        self, rule: TransposeRule | None = None, *, since: int | None = None
    ) -> TransposeRule | Callable[[TransposeRule], TransposeRule]:
        """Registers a transpose rule (the operator is linear in the inputs it marks)."""
        return self._decorator(transpose_rules, rule, since)  # type: ignore[return-value]

    @overload
    def batch(self, rule: BatchRule, *, since: int | None = None) -> BatchRule: ...
    @overload
    def batch(
        self, rule: None = None, *, since: int | None = None
    ) -> Callable[[BatchRule], BatchRule]: ...
    def batch(
        self, rule: BatchRule | None = None, *, since: int | None = None
    ) -> BatchRule | Callable[[BatchRule], BatchRule]:
        """Registers a batch rule (vmap)."""
        return self._decorator(batch_rules, rule, since)  # type: ignore[return-value]

    @overload
    def lowering(self, rule: LoweringRule, *, since: int | None = None) -> LoweringRule: ...
    @overload
    def lowering(
        self, rule: None = None, *, since: int | None = None
    ) -> Callable[[LoweringRule], LoweringRule]: ...
    def lowering(
        self, rule: LoweringRule | None = None, *, since: int | None = None
    ) -> LoweringRule | Callable[[LoweringRule], LoweringRule]:
        """Registers a lowering into primitives (used where a transform has no rule)."""
        return self._decorator(lowerings, rule, since)  # type: ignore[return-value]

    def defjvp(self, *partials: PartialJvp | None, since: int | None = None) -> JvpRule:
        """Registers a jvp rule from one contribution per input (JAX's ``defjvp``).

        ``partials[i]`` maps the tangent of input ``i`` to its part of the tangent of output 0
        (``None``: the output does not depend on that input differentiably). The rule sums the
        parts of the inputs whose tangent is not a symbolic zero; every further output gets a
        zero tangent. Returns the rule.
        """

        def rule(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
            parts = [
                partial(em, node, t)
                for partial, t in zip(partials, tangents, strict=False)
                if partial is not None and t is not None
            ]
            return [em.add_all(parts), *([None] * (len(node.outputs) - 1))]

        rule.__qualname__ = f"defjvp[{'/'.join(self.op_types)}]"
        return self.jvp(rule, since=since)

    def zero(self, *, since: int | None = None) -> JvpRule:
        """Registers a jvp rule giving every output a zero tangent; returns the rule.

        For operators whose outputs are integer, boolean or piecewise constant.
        """

        def rule(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
            return [None] * len(node.outputs)

        rule.__qualname__ = f"zero[{'/'.join(self.op_types)}]"
        return self.jvp(rule, since=since)
