"""Closure: every operator that a rule emits has rules itself.

The operators are enumerated from the derivative models of every rule test case, so a new rule
that emits an operator without rules fails here. Forward mode must be able to differentiate every
operator of a derivative model (that is what makes ``jvp(grad(m))`` and ``jvp(jvp(m))`` work),
and every operator applied to a tangent needs a transpose rule (what makes ``vjp(jvp(m))`` work).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import defaultdict

import onnx_ir as ir
import pytest

import onnax
import rules as rule_tests
from cases import Case
from onnax.core.registry import batch_rules, jvp_rules, transpose_rules
from onnax.rules import collect


def all_cases() -> list[Case]:
    cases: list[Case] = []
    for info in pkgutil.iter_modules(rule_tests.__path__):
        module = importlib.import_module(f"rules.{info.name}")
        cases.extend(getattr(module, "CASES", []))
    return cases


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
            for derived in (j, v):
                for node in derived.graph:
                    anywhere[(node.op_type, opset)].add(case.name)
            for node in linear_nodes(j, "fwd_"):
                on_tangents[(node.op_type, opset)].add(case.name)
    return anywhere, on_tangents


def test_there_are_cases() -> None:
    assert len(all_cases()) > 20


def test_every_emitted_operator_has_a_jvp_rule(emitted) -> None:
    anywhere, _ = emitted
    missing = {
        f"{op}@{opset}": sorted(cases)[:3]
        for (op, opset), cases in anywhere.items()
        if jvp_rules.lookup("", op, opset) is None
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
        if batch_rules.lookup("", op, opset) is None
    }
    assert not missing, f"operators in derivative models without a batch rule: {missing}"


def test_operator_docs_are_generated_from_the_registry() -> None:
    import pathlib

    from onnax.rules.catalog import operators_markdown

    path = pathlib.Path(__file__).parents[1] / "docs" / "operators.md"
    assert path.read_text() == operators_markdown(), (
        "docs/operators.md is stale: run `uv run python -m onnax.rules.catalog > docs/operators.md`"
    )
