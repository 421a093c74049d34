"""Repairing what onnx.version_converter makes of an opset-8 Scan.

Scan-8 carries a batch axis in front of every state and scan input (and output) and runs the
body once per example; Scan-9 has none. onnx's Scan 8 -> 9 adapter drops the ``sequence_lens``
input and then strips the first dimension from the *graph's* input and output declarations
(whatever the batch size), instead of removing it from the values the Scan reads and writes:
the converted model takes inputs of a lower rank than the original (``[1, 3, 2]`` becomes
``[3, 2]``), and onnxruntime rejects the original data ("Invalid rank for input").

:func:`unbatch_scan8` restores the original declarations and squeezes the batch axis around
each converted Scan instead, which is exact when the batch has one example (the corpus's
``test_scan_sum``). A larger batch has no Scan-9 equivalent without a loop over examples, and
``sequence_lens`` (per-example lengths) none at all: both are refused.
"""

from __future__ import annotations

import onnx
import onnx.helper

__all__ = ["unbatch_scan8"]


def _dims(value: onnx.ValueInfoProto) -> list[int | str | None]:
    if not value.type.tensor_type.HasField("shape"):
        return []
    return [
        d.dim_value if d.HasField("dim_value") else d.dim_param or None
        for d in value.type.tensor_type.shape.dim
    ]


def unbatch_scan8(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    """Repairs, in place, the top-level Scans that ``after`` converted from ``before``'s Scan-8s.

    Args:
        before: The model as it was at opset 8 (or older).
        after: ``onnx.version_converter.convert_version(before, ...)``, at opset 11 or newer.

    Raises:
        ValueError: When a Scan-8 has ``sequence_lens`` or a batch other than one example
            (the message names the node and the remedy).
    """
    version = next((o.version for o in before.opset_import if o.domain in ("", "ai.onnx")), 1)
    if version >= 9:
        return  # its Scans are Scan-9 or later already
    declared = {v.name: v for v in (*before.graph.input, *before.graph.output)}
    declared.update({v.name: v for v in before.graph.value_info})
    scans = [n for n in before.graph.node if n.op_type == "Scan" and n.domain in ("", "ai.onnx")]
    if not scans:
        return
    for scan in scans:
        label = f"Scan node {scan.name or '<unnamed>'!r} (outputs {list(scan.output)})"
        if scan.input and scan.input[0]:
            raise ValueError(
                f"{label} has sequence_lens {scan.input[0]!r}: opset-8 Scan's per-example lengths "
                "have no equivalent at opset 9 or later. Remedy: rewrite the model with Scan-9 "
                "(opset >= 9) or Loop."
            )
        for name in [*scan.input[1:], *scan.output]:
            dims = _dims(declared[name]) if name in declared else []
            if not dims or dims[0] != 1:
                raise ValueError(
                    f"{label}: the batch axis of {name!r} is {dims[0] if dims else 'unknown'}, "
                    "and only a batch of one example has an opset-9 equivalent (without a loop "
                    "over examples). Remedy: give it a batch axis of size 1, or rewrite the model "
                    "with Scan-9 (opset >= 9)."
                )
    _rewrite(before, after, scans)


def _rewrite(before: onnx.ModelProto, after: onnx.ModelProto, scans: list[onnx.NodeProto]) -> None:
    targets = {tuple(s.output) for s in scans}
    names = {n for s in scans for n in (*s.input[1:], *s.output)}
    nodes: list[onnx.NodeProto] = []
    zero = "scan8_batch_axis"
    nodes.append(
        onnx.helper.make_node(
            "Constant",
            [],
            [zero],
            value=onnx.helper.make_tensor(zero, onnx.TensorProto.INT64, [1], [0]),
        )
    )
    for node in after.graph.node:
        if node.op_type != "Scan" or tuple(node.output) not in targets:
            nodes.append(node)
            continue
        inputs = []
        for name in node.input:
            squeezed = f"{name}__scan8_example"
            nodes.append(onnx.helper.make_node("Squeeze", [name, zero], [squeezed]))
            inputs.append(squeezed)
        outputs = [f"{name}__scan8_example" for name in node.output]
        scan = onnx.NodeProto()
        scan.CopyFrom(node)
        del scan.input[:]
        scan.input.extend(inputs)
        del scan.output[:]
        scan.output.extend(outputs)
        nodes.append(scan)
        for inner, outer in zip(outputs, node.output, strict=True):
            nodes.append(onnx.helper.make_node("Unsqueeze", [inner, zero], [outer]))
    del after.graph.node[:]
    after.graph.node.extend(nodes)
    original = {v.name: v for v in (*before.graph.input, *before.graph.output)}
    for group in (after.graph.input, after.graph.output):
        for value in group:
            if value.name in original and value.name in names:
                value.CopyFrom(original[value.name])
    kept = [v for v in after.graph.value_info if v.name not in names]
    del after.graph.value_info[:]
    after.graph.value_info.extend(kept)
