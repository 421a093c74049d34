"""A sampled, seeded run of the random-graph fuzzer (:mod:`fuzzing`); the long sweep is
``tests/benchmarks/fuzz.py``."""

from __future__ import annotations

import numpy as np
import pytest

import fuzzing
from fuzz_generator import Generator
from fuzz_graphs import Kink
from onnax.core.registry import jvp_rules

# Seeds of the sampled run: graphs of up to 12 nodes keep the whole file near 30 s on one core.
SEEDS = range(1000, 1016)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_graph_passes_every_stage(seed: int) -> None:
    spec = fuzzing.generate(seed, nodes=int(np.random.default_rng(seed).integers(2, 13)))
    failures = [o for o in fuzzing.check(spec) if o.failed]
    assert not failures, "\n".join(
        [f"{o.stage}: {o.kind}: {o.detail}" for o in failures] + [fuzzing.reproducer(spec)]
    )


def test_generator_covers_the_rule_families_opsets_and_types() -> None:
    specs = [Generator(s).build() for s in range(150)]
    text = "\n".join(s.text() for s in specs)
    for op in ["MatMul", "Gemm", "ReduceMax", "Reshape", "Gather", "Conv", "MaxPool", "Where"]:
        assert f"= {op} " in text, op
    for op in ["If", "Scan", "Loop", "Softmax", "Concat", "Slice", "Expand", "Unsqueeze"]:
        assert f"= {op} " in text or f", {op}" in text or f" {op} (" in text, op
    assert {s.opset for s in specs} == set(range(11, 25))
    assert {s.dtype for s in specs} == {"float", "double"}
    assert any("N" in v.shape for s in specs for v in s.inputs)
    sizes = [len(s.ops) for s in specs]
    assert min(sizes) >= 2 and max(sizes) <= 25


def test_validation_rejects_points_near_a_kink() -> None:
    near = [np.array([0.3, -0.01, 1.0])]
    far = [np.array([0.3, -0.5, 1.0])]
    assert not fuzzing._clear_of(Kink("abs", ("x",), (0.0,)), near, 0.02)
    assert fuzzing._clear_of(Kink("abs", ("x",), (0.0,)), far, 0.02)
    tie = [np.array([[1.0, 1.005, 0.2], [0.1, 0.5, 0.9]])]
    assert not fuzzing._clear_of(Kink("top", ("x",), (1,)), tie, 0.02)
    assert fuzzing._clear_of(Kink("top", ("x",), (0,)), tie, 0.02)


def test_planted_wrong_rule_is_caught_and_shrunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzzer can fail: a Tanh jvp rule with the wrong sign is found and isolated."""
    entries = jvp_rules._rules[("", "Tanh")]

    def negated(rule):  # type: ignore[no-untyped-def]
        def wrong(em, node, tangents):  # type: ignore[no-untyped-def]
            return [None if t is None else em.op("Neg", [t]) for t in rule(em, node, tangents)]

        return wrong

    monkeypatch.setitem(jvp_rules._rules, ("", "Tanh"), [(v, negated(r)) for v, r in entries])
    spec = next(
        s
        for s in (fuzzing.generate(seed, nodes=8) for seed in range(100))
        if any(" = Tanh (" in op.text for op in s.ops)
    )
    failure = next(o for o in fuzzing.check(spec, ["jvp"]) if o.failed)
    assert failure.kind == "wrong"
    small = fuzzing.shrink(spec, failure)
    assert len(small.ops) <= 2 and any(" = Tanh (" in op.text for op in small.ops)
    assert "Tanh" in fuzzing.reproducer(small)
