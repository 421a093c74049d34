"""Values that control-flow subgraphs read from the enclosing graph."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["subgraph_reads"]


def subgraph_reads(node: ir.Node) -> list[ir.Value]:
    """Values from outside read by the node's subgraphs (If branches, Loop and Scan bodies).

    Read off the inner nodes' inputs rather than value ownership, which also finds a value that
    has just left its graph (vmap swaps batched graph inputs before it walks the nodes).
    """
    reads: list[ir.Value] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs = [attr.as_graph()]
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs = list(attr.as_graphs())
        else:
            continue
        for g in graphs:
            inside = {v for n in g.all_nodes() for v in n.outputs} | {
                v for sub in (g, *g.subgraphs()) for v in sub.inputs
            }
            reads.extend(
                v for n in g.all_nodes() for v in n.inputs if v is not None and v not in inside
            )
    return reads
