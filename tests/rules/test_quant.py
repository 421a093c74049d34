"""DequantizeLinear (rules in onnax.rules.quant): the derivative with respect to the scale.

Per tensor (opsets 10, 13, 19), per axis (13, 21, with a positive and a negative axis, with and
without a zero point, int8 and uint8) and blocked (21, 23, 25: a block that divides the axis and
one that does not), in float only: the scale's type is float, float16 or bfloat16 (no double in
the schema). x and the zero point are integer inputs with fixed values; the scale is the only
differentiable input. vmap against a loop with every in_axes variant (so batched and shared
scales and zero points in each layout).

QuantizeLinear (rules in onnax.rules.quant too): a zero derivative, and vmap with shared,
batched and written-out (before opset 13) quantization parameters, and its refusals.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from rules.test_elementwise import check_vmap_examples
from rules.test_zero import model_at

RNG = np.random.default_rng(7)


def ints(shape: tuple[int, ...], dtype: type = np.int8) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(max(info.min, -100), min(info.max, 100) + 1, shape).astype(dtype)


FLOAT = ("float",)

CASES = [
    Case(
        "per_tensor",
        "g (int8[N, 4] X, {T} S, int8 Z) => ({T}[N, 4] Y) { Y = DequantizeLinear(X, S, Z) }",
        opsets=(10, 13, 19),
        dtypes=FLOAT,
        fixed={"X": ints((3, 4)), "Z": np.array(3, np.int8)},
    ),
    Case(
        "per_tensor_no_zero_point_rank3",
        "g (uint8[2, N, 4] X, {T}[1] S) => ({T}[2, N, 4] Y) { Y = DequantizeLinear(X, S) }",
        opsets=(13, 21),
        dtypes=FLOAT,
        fixed={"X": ints((2, 3, 4), np.uint8)},
    ),
    Case(
        "per_axis",
        "g (int8[N, 3, 4] X, {T}[3] S, int8[3] Z) => ({T}[N, 3, 4] Y) {\n"
        " Y = DequantizeLinear<axis=1>(X, S, Z) }",
        opsets=(13, 21),
        dtypes=FLOAT,
        fixed={"X": ints((3, 3, 4)), "Z": np.array([1, -2, 0], np.int8)},
    ),
    Case(
        "per_axis_negative_uint8",
        "g (uint8[N, 2, 4] X, {T}[4] S, uint8[4] Z) => ({T}[N, 2, 4] Y) {\n"
        " Y = DequantizeLinear<axis=-1>(X, S, Z) }",
        opsets=(19,),
        dtypes=FLOAT,
        fixed={"X": ints((3, 2, 4), np.uint8), "Z": np.array([128, 3, 0, 255], np.uint8)},
    ),
    Case(
        "per_axis_first_no_zero_point",
        "g (int32[5, N] X, {T}[5] S) => ({T}[5, N] Y) { Y = DequantizeLinear<axis=0>(X, S) }",
        opsets=(13,),
        dtypes=FLOAT,
        fixed={"X": ints((5, 3), np.int32)},
    ),
    Case(
        "blocked_even",
        "g (int8[N, 4, 3] X, {T}[N, 2, 3] S, int8[N, 2, 3] Z) => ({T}[N, 4, 3] Y) {\n"
        " Y = DequantizeLinear<axis=1, block_size=2>(X, S, Z) }",
        opsets=(21, 23),
        dtypes=FLOAT,
        fixed={"X": ints((3, 4, 3)), "Z": ints((3, 2, 3))},
    ),
    Case(
        "blocked_ragged_last_axis",
        "g (int8[2, 5] X, {T}[2, 2] S) => ({T}[2, 5] Y) {\n"
        " Y = DequantizeLinear<axis=-1, block_size=3>(X, S) }",
        opsets=(21, 25),
        dtypes=FLOAT,
        fixed={"X": ints((2, 5))},
    ),
    # onnxruntime's QuantizeLinear takes float32 only.
    Case(
        "quantize_only",
        "g ({T}[N, 3] X, {T}[N, 3] W) => ({T}[N, 3] Y) { s = Constant <value = float {0.5}> ()\n"
        " z = Constant <value = uint8 {128}> ()\n q = QuantizeLinear(X, s, z)\n c = CastLike(q, W)\n Y = Mul(W, c) }",
        # Multiples of the scale: in the middle of a rounding step, far from its jumps.
        fill={"X": lambda rng, s, dt: (rng.integers(-20, 20, s) * 0.5).astype(dt)},
        opsets=(15, 21),
        dtypes=("float",),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


# ---------------------------------------------------------------------------- QuantizeLinear
QUANT_X = (np.random.default_rng(3).integers(-20, 20, (4, 6)) * 0.5).astype(np.float32)


@pytest.mark.parametrize(
    ("opset", "signature", "attrs", "feeds", "in_axes"),
    [
        # Shared per-tensor parameters.
        (11, "float S, uint8 Z", "", {"S": 0.5, "Z": 128}, {"X": 1}),
        # Shared per-axis parameters: the axis moves past the batch axis.
        (13, "float[6] S, uint8[6] Z", "<axis = 1>", {"S": 0.5, "Z": 128}, {"X": 0}),
        (21, "float[4] S, int8[4] Z", "<axis = -2>", {"S": 0.25, "Z": 3}, {"X": 1}),
        (19, "float[6] S", "<axis = 1>", {"S": 0.5}, {"X": 0}),
        # Shared blocked parameters: broadcast along the batch axis too.
        (
            21,
            "float[4, 3] S, uint8[4, 3] Z",
            "<axis = 1, block_size = 2>",
            {"S": 0.5, "Z": 128},
            {"X": 0},
        ),
        # Batched per-tensor parameters: a per-axis quantization along the batch axis.
        (13, "float S, uint8 Z", "", {"S": 0.5, "Z": 128}, {"X": 0, "S": 0}),
        (21, "float S, uint8 Z", "", {"S": 0.5, "Z": 128}, {"S": 0, "Z": 0}),
        (21, "float S, int8 Z", "<axis = 1>", {"S": 0.5, "Z": -3}, {"X": 1, "Z": 0}),
        (19, "float S", "", {"S": 0.5}, {"S": 0}),
        # Before opset 13 (no per-axis form): the definition written out, exact as onnxruntime.
        (11, "float S, uint8 Z", "", {"S": 0.5, "Z": 128}, {"X": 0, "S": 0}),
        (12, "float S, int8 Z", "", {"S": 0.5, "Z": -3}, {"S": 0, "Z": 0}),
        (11, "float S", "", {"S": 0.5}, {"X": 1, "S": 0}),
    ],
)
def test_quantize_linear(
    opset: int, signature: str, attrs: str, feeds: dict[str, float], in_axes: dict[str, int]
) -> None:
    model = model_at(
        opset,
        f"g (float[4, 6] X, {signature}) => (Y) {{ Y = QuantizeLinear {attrs} (X, {', '.join(feeds)}) }}",
    )
    values = {}
    for v in model.graph.inputs[1:]:
        shape = tuple(d for d in v.shape.dims)
        values[v.name] = np.full(shape, feeds[v.name], dtype=v.dtype.numpy())
    # Per-example parameters and inputs; scales that keep x / scale off the rounding ties.
    examples = [
        {
            "X": QUANT_X + k * 0.1,
            **{n: (a * (1 + k) if n == "S" else a + k) for n, a in values.items()},
        }
        for k in range(3)
    ]
    examples = [
        {
            n: np.asarray(a).astype(values[n].dtype if n in values else np.float32)
            for n, a in ex.items()
        }
        for ex in examples
    ]
    check_vmap_examples(model, examples, in_axes)


@pytest.mark.parametrize(("opset", "zp_type"), [(11, "uint8"), (12, "int8")])
def test_quantize_linear_written_out_rounds_and_saturates_like_onnxruntime(
    opset: int, zp_type: str
) -> None:
    # Exact halves (round half to even: -1.5 -> -2, 0.5 -> 0, 2.5 -> 2) and values past the
    # integer range on both sides, with a scale and zero point per example.
    model = model_at(
        opset,
        f"g (float[8] X, float S, {zp_type} Z) => (Y) {{ Y = QuantizeLinear (X, S, Z) }}",
    )
    x = np.array([-3.0, -1.0, 1.0, 3.0, 5.0, 700.0, -700.0, 0.0], np.float32)
    zp = np.dtype(zp_type)
    examples = [
        {"X": x * m, "S": np.array(s, np.float32), "Z": np.array(z, zp)}
        for m, s, z in (
            (1.0, 2.0, 3),
            (0.5, 1.0, 0),
            (2.0, 4.0, 100 if zp_type == "uint8" else -100),
        )
    ]
    check_vmap_examples(model, examples, {"X": 0, "S": 0, "Z": 0})


@pytest.mark.parametrize(
    ("opset", "signature", "attrs", "in_axes", "why"),
    [
        (13, "float[6] S, uint8[6] Z", "<axis = 1>", {"X": 0, "S": 0}, "per-axis or blocked"),
        (21, "float[6] S, uint8[6] Z", "<axis = 1>", {"Z": 1}, "per-axis or blocked"),
        (
            21,
            "float[4, 3] S, uint8[4, 3] Z",
            "<axis = 1, block_size = 2>",
            {"S": 0},
            "per-axis or blocked",
        ),
    ],
)
def test_vmap_refuses_batched_quantization_parameters(
    opset: int, signature: str, attrs: str, in_axes: dict[str, int], why: str
) -> None:
    model = model_at(
        opset,
        f"g (float[4, 6] X, {signature}) => (Y) {{ Y = QuantizeLinear {attrs} (X, S, Z) }}",
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes=in_axes)
    msg = str(err.value)
    name = "S" if "S" in in_axes else "Z"
    assert f"ai.onnx::QuantizeLinear at opset {opset} (the node producing 'Y')" in msg
    assert f"(input {1 if name == 'S' else 2} '{name}')" in msg and why in msg
    assert "Remedy" in msg and "in_axes None" in msg
