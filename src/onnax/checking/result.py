"""What a check found: one row per compared output, and the verdict over all of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CheckResult", "Outcome", "Row"]

Outcome = Literal["ok", "wrong", "inconclusive"]


@dataclass(frozen=True)
class Row:
    """One comparison of a derived output with its reference.

    Attributes:
        check: The transform checked (``"jvp"``, ``"grad"``, ``"vmap"``...).
        output: The derived model's output compared.
        scale: The norm of the reference (the relative tolerance scales with it).
        error: The norm of the derived output minus the reference.
        tolerance: The largest error accepted.
        outcome: ``"ok"``, ``"wrong"`` (error above tolerance) or ``"inconclusive"`` (the
            reference could not be settled at this point: finite differences disagree across
            steps, as they do next to a kink).
        note: Why, for a row that is not ``"ok"``.
    """

    check: str
    output: str
    scale: float
    error: float
    tolerance: float
    outcome: Outcome
    note: str = ""


@dataclass(frozen=True)
class CheckResult:
    """The rows of a check and how the reference was computed.

    Attributes:
        transform: The transform checked.
        rows: One row per compared output.
        reference: How the reference was evaluated (e.g. "float64 twin in onnxruntime").
        seed: The seed of the random point; another seed checks another point.
        skipped: Derived outputs left out, with the reason.
    """

    transform: str
    rows: tuple[Row, ...]
    reference: str
    seed: int
    skipped: tuple[str, ...] = field(default=())

    @property
    def outcome(self) -> Outcome | Literal["empty"]:
        """``"wrong"`` if any row is, else ``"inconclusive"`` if any row is, else ``"ok"``.

        ``"empty"`` when nothing could be compared.
        """
        if not self.rows:
            return "empty"
        kinds = {r.outcome for r in self.rows}
        for kind in ("wrong", "inconclusive"):
            if kind in kinds:
                return kind
        return "ok"

    @property
    def ok(self) -> bool:
        """Whether every row agreed with its reference (and there was at least one)."""
        return self.outcome == "ok"

    def format(self) -> str:
        """The table the command line prints."""
        head = f"{'check':<8} {'output':<28} {'|ref|':>10} {'|err|':>10} {'tolerance':>10}  result"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            word = {"ok": "ok", "wrong": "FAIL", "inconclusive": "inconclusive"}[r.outcome]
            lines.append(
                f"{r.check:<8} {r.output:<28} {r.scale:>10.3g} {r.error:>10.2e} "
                f"{r.tolerance:>10.2e}  {word}"
            )
            if r.note:
                lines.append(f"         {r.note}")
        if not self.rows:
            lines.append("(nothing compared: the result has no floating-point derivative outputs)")
        for item in self.skipped:
            lines.append(f"(not compared: {item})")
        lines.append(f"reference: {self.reference}; norms are Frobenius; point seed {self.seed}")
        return "\n".join(lines)
