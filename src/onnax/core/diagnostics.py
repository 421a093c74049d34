"""Messages for failures that depend on a node of the user's model."""

from __future__ import annotations

import onnx_ir as ir

from onnax.errors import UnsupportedOperatorError, UnsupportedValueError

__all__ = ["RANDOM_OPS", "check_active_node", "missing_rule"]

RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
    }
)


def node_label(node: ir.Node) -> str:
    """``node 'name'`` or, for an unnamed node, the name of its first output."""
    if node.name:
        return f"node {node.name!r}"
    first = node.outputs[0].name if node.outputs else None
    return f"the node producing {first!r}" if first else "an unnamed node"


def op_label(node: ir.Node) -> str:
    """``domain::op`` with the ONNX domain spelled ``ai.onnx``."""
    return f"{node.domain or 'ai.onnx'}::{node.op_type}"


def _active_input(node: ir.Node, active: list[bool]) -> str:
    for i, (v, a) in enumerate(zip(node.inputs, active, strict=False)):
        if a and v is not None:
            return f"input {i} {v.name!r}"
    return "an input captured by a subgraph"


def missing_rule(
    transform: str, node: ir.Node, opset: int, active: list[bool]
) -> UnsupportedOperatorError:
    """The error for an operator without a rule on a path that carries a derivative."""
    return UnsupportedOperatorError(
        f"{transform}: no derivative rule for {op_label(node)} at opset {opset} "
        f"({node_label(node)}); the derivative reaches it through {_active_input(node, active)}. "
        "Remedy: if you do not need derivatives through this node, leave the inputs that feed it "
        "out of `inputs`; otherwise register its rules: "
        f"onnax.rules.register({node.domain!r}, {node.op_type!r}, jvp=...), or "
        "register_elementwise / register_linear / register_zero_derivative "
        "(docs/writing-rules.md)."
    )


def check_active_node(transform: str, node: ir.Node, opset: int, active: list[bool]) -> None:
    """Refuses random operators and sequence or optional values on an active path.

    Raises:
        UnsupportedValueError: With a message specific to the kind of value.
    """

    def where() -> str:  # only for a message: every active node of every transform comes here
        return f"{op_label(node)} at opset {opset} ({node_label(node)})"

    if node.domain == "" and node.op_type in RANDOM_OPS:
        raise UnsupportedValueError(
            f"{transform}: {where()} draws random numbers from a value that carries a derivative "
            f"({_active_input(node, active)}). A random sample has no derivative with respect to "
            "the tensor that sets its shape or distribution. Remedy: feed the sample as a model "
            "input (draw it outside the model), or leave the inputs that reach it out of `inputs`."
        )
    for v in (*node.inputs, *node.outputs):
        # The exact class first: onnx_ir's types are runtime protocols, and the two checks
        # below cost three microseconds a value on every active node of every transform.
        if v is None or v.type is None or type(v.type) is ir.TensorType:
            continue
        if isinstance(v.type, ir.SequenceType):
            raise UnsupportedValueError(
                f"{transform}: {where()} handles a Sequence value ({v.name!r}) on a path that "
                "carries a derivative; onnax differentiates tensors only. Remedy: rewrite the "
                "sequence ops as tensor ops (Concat/Split/Gather), or leave the inputs that reach "
                "them out of `inputs`."
            )
        if isinstance(v.type, ir.OptionalType):
            raise UnsupportedValueError(
                f"{transform}: {where()} handles an Optional value ({v.name!r}) on a path that "
                "carries a derivative; onnax differentiates tensors only. Remedy: replace the "
                "optional by a plain tensor input, or leave the inputs that reach it out of `inputs`."
            )
