"""The numpy kernels of the static evaluator give what the ONNX reference implementation gives."""

from __future__ import annotations

import warnings

import numpy as np
import onnx_ir as ir
import pytest

from onnax.core import static


def _node(op_type: str, arity: int) -> ir.Node:
    inputs = [ir.Value(name=f"i{k}") for k in range(arity)]
    return ir.Node("", op_type, inputs, num_outputs=1)


def _reference(node: ir.Node, args: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    names = tuple(f"i{k}" if a is not None else "" for k, a in enumerate(args))
    proto = ir.serde.serialize_node(node)
    del proto.input[:]
    proto.input.extend(names)
    del proto.output[:]
    proto.output.extend(["o0"])
    proto.ClearField("name")
    evaluator = static._evaluator(proto.SerializeToString(deterministic=True), names, opset)
    feeds = {n: a for n, a in zip(names, args, strict=True) if n}
    return [np.asarray(r) for r in evaluator.run(None, feeds)]


CASES = {
    "add broadcast": (
        "Add",
        [np.ones((2, 3), np.float32), np.float32(1e-5) * np.ones(3, np.float32)],
    ),
    "add scalars": ("Add", [np.array(1.5, np.float32), np.array(2.25, np.float32)]),
    "add int": ("Add", [np.arange(4, dtype=np.int64), np.array([7], np.int64)]),
    "add double": ("Add", [np.linspace(0, 1, 5), np.linspace(1, 2, 5)]),
    "sqrt": ("Sqrt", [np.array([0.0, 2.0, 9.0], np.float32)]),
    "sqrt negative": ("Sqrt", [np.array([-1.0, 4.0], np.float32)]),
    "sqrt scalar": ("Sqrt", [np.array(2.0, np.float64)]),
    "unsqueeze": ("Unsqueeze", [np.arange(3, dtype=np.float32), np.array([1, 2], np.int64)]),
    "unsqueeze negative": ("Unsqueeze", [np.ones((2, 3), np.float32), np.array([-1], np.int64)]),
    "unsqueeze scalar": ("Unsqueeze", [np.array(3.0, np.float32), np.array([0], np.int64)]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_numpy_kernel_gives_the_reference_result(case: str) -> None:
    op_type, args = CASES[case]
    node = _node(op_type, len(args))
    assert static._numpy_kernel(node, list(args), 21) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the reference silences Sqrt's warnings: so must we
        (fast,) = static.evaluate(node, list(args), 21)
    (ref,) = _reference(node, list(args), 21)
    assert fast.dtype == ref.dtype and fast.shape == ref.shape
    assert np.array_equal(fast, ref, equal_nan=True)
    assert fast.tobytes() == ref.tobytes()


def test_other_nodes_go_to_the_reference() -> None:
    f32, f64 = np.ones(2, np.float32), np.ones(2, np.float64)
    kernel = static._numpy_kernel
    assert kernel(_node("Add", 2), [f32, f64], 21) is None  # the reference refuses mixed types
    assert kernel(_node("Add", 2), [f32, None], 21) is None
    assert kernel(_node("Sqrt", 1), [np.arange(3)], 21) is None  # integers: not a float kernel
    axes = np.array([0], np.int64)
    assert kernel(_node("Unsqueeze", 2), [f32, axes], 11) is None  # axes were an attribute
    assert kernel(_node("Mul", 2), [f32, f32], 21) is None
    with_attr = _node("Add", 2)
    with_attr.attributes["x"] = ir.AttrInt64("x", 1)
    assert kernel(with_attr, [f32, f32], 21) is None
    # What numpy refuses, the reference refuses too, with its own error.
    with pytest.raises(Exception):  # noqa: B017 (the reference's own error type)
        static.evaluate(_node("Unsqueeze", 2), [f32, np.array([5], np.int64)], 21)
