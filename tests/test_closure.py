"""Closure: every operator that a rule emits has rules itself.

The operators are enumerated from the derivative models of every rule test case, so a new rule
that emits an operator without rules fails here. Forward mode must be able to differentiate every
operator of a derivative model (that is what makes ``jvp(grad(m))`` and ``jvp(jvp(m))`` work),
and every operator applied to a tangent needs a transpose rule (what makes ``vjp(jvp(m))`` work).

An emitted operator without a jvp or batch rule is also covered when the transforms expand it
(:mod:`onnax.passes.expand`: a registered lowering, or its ONNX function body at that opset), as
long as its expansion consists of covered operators in turn. The cases of ``test_expand`` join
the rule cases, so the operators that expansions emit are enumerated too.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import defaultdict

import onnx_ir as ir
import pytest

import onnax
import rules as rule_tests
import test_expand
from cases import Case
from onnax.core.functions import static_body_operators
from onnax.core.registry import Registry, batch_rules, jvp_rules, lowerings, transpose_rules
from onnax.rules import collect
from onnax.rules.catalog import function_body_opsets


def all_cases() -> list[Case]:
    cases: list[Case] = []
    for info in pkgutil.iter_modules(rule_tests.__path__):
        module = importlib.import_module(f"rules.{info.name}")
        cases.extend(getattr(module, "CASES", []))
    return cases + list(test_expand.CASES)


def expanded_by(op: str, opset: int) -> str | None:
    """How the transforms expand ``op`` at ``opset`` when it has no rule: lowering/body/None."""
    if lowerings.lookup("", op, opset) is not None:
        return "lowering"
    if opset in function_body_opsets().get(op, ()):
        return "body"
    return None


def covered(registry: Registry, op: str, opset: int, depth: int = 0) -> bool:
    """A rule in ``registry``, or an expansion whose static body is covered in turn.

    Lowerings and context-dependent bodies cannot be enumerated without a node; the cases of
    ``test_expand`` (which join the fixture below) enumerate what they emit.
    """
    if registry.lookup("", op, opset) is not None:
        return True
    how = expanded_by(op, opset)
    if how is None or depth > 8:
        return False
    static = static_body_operators(op, opset) if how == "body" else None
    if static is None:
        return True
    return all(
        inner == "Constant" or covered(registry, inner, opset, depth + 1) for inner in static[1]
    )


def linear_nodes(model: ir.Model, tangent_prefix: str) -> list[ir.Node]:
    active = {v for v in model.graph.inputs if v.name.startswith(tangent_prefix)}
    found = []
    for node in model.graph:
        if any(v in active for v in node.inputs if v is not None):
            found.append(node)
            active.update(node.outputs)
    return found


@pytest.fixture(scope="module")
def emitted() -> tuple[dict[tuple[str, int], set[str]], dict[tuple[str, int], set[str]]]:
    collect()
    anywhere: dict[tuple[str, int], set[str]] = defaultdict(set)
    on_tangents: dict[tuple[str, int], set[str]] = defaultdict(set)
    for case in all_cases():
        for opset in case.opsets:
            model = case.model("double", opset)
            try:
                j = onnax.jvp(model, case.inputs)
                v = onnax.vjp(model, case.inputs)
            except onnax.OnnaxError:
                continue
            # Models older than the oldest served opset are converted first: the derived
            # model's opset is the one its operators must be covered at.
            served = j.opset_imports[""]
            for derived in (j, v):
                for node in derived.graph:
                    anywhere[(node.op_type, served)].add(case.name)
            for node in linear_nodes(j, "fwd_"):
                on_tangents[(node.op_type, served)].add(case.name)
    return anywhere, on_tangents


def test_there_are_cases() -> None:
    assert len(all_cases()) > 20


def test_every_emitted_operator_has_a_jvp_rule(emitted) -> None:
    anywhere, _ = emitted
    missing = {
        f"{op}@{opset}": sorted(cases)[:3]
        for (op, opset), cases in anywhere.items()
        if not covered(jvp_rules, op, opset)
    }
    assert not missing, f"operators in derivative models without a jvp rule: {missing}"


def test_every_operator_applied_to_a_tangent_has_a_transpose_rule(emitted) -> None:
    _, on_tangents = emitted
    missing = {
        f"{op}@{opset}": sorted(cases)[:3]
        for (op, opset), cases in on_tangents.items()
        if transpose_rules.lookup("", op, opset) is None
    }
    assert not missing, f"operators applied to tangents without a transpose rule: {missing}"


def test_every_operator_with_derivative_rules_has_a_batch_rule() -> None:
    collect()
    missing = sorted(op for domain, op in jvp_rules if (domain, op) not in batch_rules)
    assert not missing, f"operators with jvp rules but no batch rule: {missing}"


def test_every_emitted_operator_has_a_batch_rule(emitted) -> None:
    anywhere, _ = emitted
    missing = {
        f"{op}@{opset}": sorted(cases)[:3]
        for (op, opset), cases in anywhere.items()
        if not covered(batch_rules, op, opset)
    }
    assert not missing, f"operators in derivative models without a batch rule: {missing}"


def test_expansions_of_emitted_operators_are_covered(emitted) -> None:
    """Where an emitted operator is covered by expansion only, its static body is covered."""
    anywhere, _ = emitted
    expanded = {
        (op, opset)
        for (op, opset) in anywhere
        if jvp_rules.lookup("", op, opset) is None and expanded_by(op, opset) is not None
    }
    bad = sorted(
        f"{op}@{opset}"
        for op, opset in expanded
        if not (covered(jvp_rules, op, opset) and covered(batch_rules, op, opset))
    )
    assert not bad, f"expansions emitting operators without rules: {bad}"


def test_operator_docs_are_generated_from_the_registry() -> None:
    import pathlib

    from onnax.rules.catalog import operators_markdown

    path = pathlib.Path(__file__).parents[1] / "docs" / "operators.md"
    assert path.read_text() == operators_markdown(), (
        "docs/operators.md is stale: run `uv run python -m onnax.rules.catalog > docs/operators.md`"
    )
