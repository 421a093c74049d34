"""The dispatch snapshot: which rule serves each ``(kind, domain, op, opset)``.

A rule is named by its place in its operator's sequence of distinct rules (``0`` for the rule
serving the oldest opset, ``1`` for the next different one, ...), so the snapshot is blind to
where a rule lives and what it is called, and sees every change of which opsets share a rule,
which have one and which have none. ``python tests/dispatch.py > tests/data/dispatch.json``
regenerates it; only do that for an intended change of dispatch.
"""

from __future__ import annotations

import json
import types
from collections.abc import Hashable

from onnax.core.registry import Registry, batch_rules, jvp_rules, lowerings, transpose_rules
from onnax.rules import collect
from onnax.rules.custom import registered

OPSETS = range(7, 29)
REGISTRIES: dict[str, Registry] = {
    "jvp": jvp_rules,
    "transpose": transpose_rules,
    "batch": batch_rules,
    "lowering": lowerings,
}


def rule_key(rule: object) -> Hashable:
    """What makes two registered rules the same rule: their code and what their closures hold.

    The same factory called once per version with the same arguments (``note_ranks(rule)``)
    gives equal keys; called with other arguments (``_group_norm_jvp(per)``) it does not.
    """
    if isinstance(rule, types.FunctionType):
        cells = tuple(rule_key(c.cell_contents) for c in rule.__closure__ or ())
        return (rule.__code__, cells, rule_key(rule.__defaults__))
    if isinstance(rule, tuple):
        return tuple(rule_key(r) for r in rule)
    if isinstance(rule, (str, int, float, bool, type(None))):
        return ("value", rule)
    return ("object", id(rule))


def dispatch_table() -> dict[str, dict[str, str]]:
    """``{kind: {"domain::op": "-,-,0,0,1,..."}}`` over opsets 7..28 (``-``: no rule)."""
    collect()
    # rules registered through the public API (by its tests, in the same process) are not
    # onnax's own
    public = registered()
    table: dict[str, dict[str, str]] = {}
    for kind, registry in REGISTRIES.items():
        ops: dict[str, str] = {}
        for domain, op in registry:
            if (domain, op) in public:
                continue
            seen: dict[Hashable, int] = {}
            cells = []
            for opset in OPSETS:
                rule = registry.lookup(domain, op, opset)
                if rule is None:
                    cells.append("-")
                else:
                    cells.append(str(seen.setdefault(rule_key(rule), len(seen))))
            ops[f"{domain}::{op}"] = ",".join(cells)
        table[kind] = ops
    return table


if __name__ == "__main__":
    print(json.dumps(dispatch_table(), indent=1, sort_keys=True))
