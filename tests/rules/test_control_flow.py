"""Control flow (rules in the package onnax.rules.control_flow): If, Scan and Loop in jvp and vjp.

Every case is checked by ``run_case``: jvp and vjp against float64 central differences through
onnxruntime, and jvp against vjp by the adjoint identity, in float and double, at opsets 11, 13,
16, 21 and 25 (If and Loop changed at 11, 13, 16, 19, 21, 23, 24, 25; Scan at 11, 16, 19, 21,
23, 24, 25; the changes are about sequence/optional states and the element types allowed, which
these tensor models keep within). The cases cover: an If whose condition depends on the data (both branches taken by
different fills), outer weights captured by every kind of body, a Scan with several states and
scan inputs, reverse directions and non-zero axes, a Loop with a trip count and a termination
condition that depend on the data, a Loop that runs zero times, and a Scan in a Loop in an If.
"""

from __future__ import annotations

import numpy as np
import pytest

from cases import Case, case_id, parametrize, positive, run_case

OPSETS = (11, 13, 16, 21, 25)


def negative(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return -positive(rng, shape, dtype)


IF_TEXT = """
g ({T}[N] X, {T}[N] W) => ({T}[N] Y, {T}[N] Z) {
    zero = Constant <value = {T} {0}> ()
    m = ReduceMax <keepdims = 0> (X)
    c = Greater(m, zero)
    Y, Z = If (c) <
        then_branch = g1 () => ({T}[N] t1, {T}[N] t2) {
            a = Mul(X, W)
            t1 = Tanh(a)
            t2 = Mul(t1, X)
        },
        else_branch = g2 () => ({T}[N] e1, {T}[N] e2) {
            s = Sin(X)
            e1 = Mul(s, s)
            e2 = Identity(W)
        }
    >
}
"""

SCAN_TEXT = """
g ({T}[N] H, {T}[N] S, {T}[K, N] Xs, {T}[N, K] Us, {T}[N] W) => ({T}[N] Hf, {T}[N] Sf, {T}[K, N] Ys, {T}[N, K] Zs) {
    Hf, Sf, Ys, Zs = Scan (H, S, Xs, Us) <
        num_scan_inputs = 2, scan_input_directions = [1, 0], scan_input_axes = [0, 1],
        scan_output_directions = [0, 1], scan_output_axes = [0, 1],
        body = sb ({T}[N] h, {T}[N] s, {T}[N] x, {T}[N] u) => ({T}[N] h2, {T}[N] s2, {T}[N] y, {T}[N] z) {
            a = Mul(h, W)
            b = Add(a, x)
            h2 = Tanh(b)
            c = Mul(s, u)
            s2 = Add(c, h)
            y = Mul(h2, s)
            z = Sin(s2)
        }
    >
}
"""

SCAN_MATMUL_TEXT = """
g ({T}[1, 3] H, {T}[K, 1, 3] Xs, {T}[3, 3] W) => ({T}[1, 3] Hf, {T}[K, 1, 3] Ys) {
    Hf, Ys = Scan (H, Xs) <
        num_scan_inputs = 1,
        body = sb ({T}[1, 3] h, {T}[1, 3] x) => ({T}[1, 3] h2, {T}[1, 3] y) {
            a = MatMul(h, W)
            b = Add(a, x)
            h2 = Tanh(b)
            y = Identity(h2)
        }
    >
}
"""

LOOP_TEXT = """
g (int64 M, {T}[N] X, {T}[N] W) => ({T}[N] Fin, {T}[K, N] Acc) {
    cond = Constant <value = bool {1}> ()
    Fin, Acc = Loop (M, cond, X) <
        body = lb (int64 i, bool c, {T}[N] s) => (bool c2, {T}[N] s2, {T}[N] y) {
            c2 = Identity(c)
            e = Sin(s)
            s2 = Mul(e, W)
            y = Mul(s2, s)
        }
    >
}
"""

# The termination depends on the state: it doubles (plus a little of W) until its maximum
# reaches 50; the fixed values keep the stopping iteration far from a tie. The trip count is an
# input: a constant one makes onnx_shape_inference claim the scan outputs have that many rows,
# which is wrong for a loop that stops early.
LOOP_WHILE_TEXT = """
g (int64 big, {T}[3] X, {T}[3] W) => ({T}[3] Fin, {T}[K, 3] Acc) {
    cond = Constant <value = bool {1}> ()
    two = Constant <value = {T} {2}> ()
    limit = Constant <value = {T} {50}> ()
    Fin, Acc = Loop (big, cond, X) <
        body = lb (int64 i, bool c, {T}[3] s) => (bool c2, {T}[3] s2, {T}[3] y) {
            d = Mul(s, two)
            w = Sin(W)
            s2 = Add(d, w)
            m = ReduceMax <keepdims = 0> (s2)
            c2 = Less(m, limit)
            y = Mul(s2, w)
        }
    >
}
"""

# The trip count is computed from the data (Floor of a maximum): 2 for the fill used.
LOOP_TRIPS_TEXT = """
g ({T}[N] X, {T}[N] W) => ({T}[N] Fin, {T}[K, N] Acc) {
    m = ReduceMax <keepdims = 0> (X)
    f = Floor(m)
    M = Cast <to = 7> (f)
    Fin, Acc = Loop (M, , X) <
        body = lb (int64 i, bool c, {T}[N] s) => (bool c2, {T}[N] s2, {T}[N] y) {
            c2 = Identity(c)
            a = Tanh(s)
            s2 = Mul(a, W)
            y = Add(s2, s)
        }
    >
}
"""

# A weight carried as loop state and passed through unchanged (body output = body input), and the
# condition passed through likewise.
LOOP_PASSTHROUGH_TEXT = """
g (int64 M, {T}[N] X, {T}[N] W) => ({T}[N] Fin, {T}[N] Wf, {T}[K, N] Acc) {
    cond = Constant <value = bool {1}> ()
    Fin, Wf, Acc = Loop (M, cond, X, W) <
        body = lb (int64 i, bool c, {T}[N] s, {T}[N] w) => (bool c, {T}[N] s2, {T}[N] w, {T}[N] y) {
            e = Sin(s)
            s2 = Mul(e, w)
            y = Mul(s2, s)
        }
    >
}
"""

NESTED_TEXT = """
g ({T}[N] X, {T}[K, N] Xs, {T}[N] W) => ({T}[N] Y) {
    zero = Constant <value = {T} {0}> ()
    m = ReduceMax <keepdims = 0> (X)
    c = Greater(m, zero)
    two = Constant <value = int64 {2}> ()
    Y = If (c) <
        then_branch = g1 () => ({T}[N] t) {
            t = Loop (two, , X) <
                body = lb (int64 i, bool cin, {T}[N] s) => (bool cout, {T}[N] s2) {
                    cout = Identity(cin)
                    f, ys = Scan (s, Xs) <
                        num_scan_inputs = 1,
                        body = sb ({T}[N] h, {T}[N] x) => ({T}[N] h2, {T}[N] y) {
                            a = Mul(h, W)
                            b = Add(a, x)
                            h2 = Tanh(b)
                            y = Mul(h2, X)
                        }
                    >
                    s2 = Mul(f, W)
                }
            >
        },
        else_branch = g2 () => ({T}[N] e) {
            e = Mul(X, W)
        }
    >
}
"""

# An If per iteration whose condition depends on the scan input: both branches run.
SCAN_IF_TEXT = """
g ({T}[N] H, {T}[K, N] Xs, {T}[N] W) => ({T}[N] Hf, {T}[K, N] Ys) {
    Hf, Ys = Scan (H, Xs) <
        num_scan_inputs = 1,
        body = sb ({T}[N] h, {T}[N] x) => ({T}[N] h2, {T}[N] y) {
            zero = Constant <value = {T} {0}> ()
            m = ReduceMax <keepdims = 0> (x)
            c = Greater(m, zero)
            h2 = If (c) <
                then_branch = g1 () => ({T}[N] t) {
                    a = Mul(h, W)
                    t = Tanh(a)
                },
                else_branch = g2 () => ({T}[N] e) {
                    b = Add(h, x)
                    e = Sin(b)
                }
            >
            y = Mul(h2, x)
        }
    >
}
"""

CASES = [
    Case("if_then", IF_TEXT, opsets=OPSETS, fill={"X": positive}),
    Case("if_else", IF_TEXT, opsets=OPSETS, fill={"X": negative}),
    Case("scan_states_axes_directions", SCAN_TEXT, opsets=OPSETS, dims={"K": 4}),
    Case("scan_matmul_weight", SCAN_MATMUL_TEXT, opsets=OPSETS, dims={"K": 5}),
    Case("loop_trip_count", LOOP_TEXT, opsets=OPSETS, fixed={"M": np.array(3)}),
    Case(
        "loop_passthrough_state",
        LOOP_PASSTHROUGH_TEXT,
        opsets=(13, 21),
        fixed={"M": np.array(3)},
    ),
    Case("loop_zero_iterations", LOOP_TEXT, opsets=(13, 21), fixed={"M": np.array(0)}),
    Case(
        "loop_data_dependent_termination",
        LOOP_WHILE_TEXT,
        opsets=OPSETS,
        fixed={
            "big": np.array(20),
            "X": np.array([0.3, 0.7, 1.1]),
            "W": np.array([0.1, -0.2, 0.3]),
        },
    ),
    Case(
        "loop_data_dependent_trip_count",
        LOOP_TRIPS_TEXT,
        opsets=OPSETS,
        fixed={"X": np.array([0.5, 2.5, -1.0]), "W": np.array([0.9, -1.1, 0.7])},
    ),
    Case(
        "scan_with_if_per_iteration",
        SCAN_IF_TEXT,
        opsets=(11, 16),
        dims={"K": 4},
        fixed={
            "Xs": np.array(
                [[0.5, -1.0, 0.2], [-0.3, -0.7, -1.1], [1.2, 0.4, -0.6], [-2.0, -0.1, -0.4]]
            )
        },
    ),
    Case("nested_scan_loop_if_then", NESTED_TEXT, opsets=(13, 21), fill={"X": positive}),
    Case("nested_scan_loop_if_else", NESTED_TEXT, opsets=(13,), fill={"X": negative}),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


# Outputs that hand a value on unchanged: a state updated by an Identity or an Add of a scan
# input (the state's tangent passes straight through the body), a scan output that is an
# Identity of a scan input, of a state or of a captured value, and a Loop whose body outputs are
# its inputs themselves. (A Scan body output that *is* a body input is left out: onnxruntime's
# Scan returns uninitialised memory for it, so no oracle exists.)
SCAN_ADD_TEXT = """
g ({T}[2] a0, {T}[K, 2] xs) => ({T}[2] a) {
    a = Scan (a0, xs) <num_scan_inputs = 1,
        body = sb ({T}[2] a_in, {T}[2] x) => ({T}[2] a_out) { a_out = Add(a_in, x) }>
}
"""

SCAN_IDENTITY_TEXT = """
g ({T}[2] a0, {T}[2] b0, {T}[K, 2] xs, {T}[2] w) => ({T}[2] a, {T}[2] b, {T}[K, 2] ys, {T}[K, 2] zs, {T}[K, 2] ws) {
    a, b, ys, zs, ws = Scan (a0, b0, xs) <num_scan_inputs = 1,
        body = sb ({T}[2] a_in, {T}[2] b_in, {T}[2] x) => ({T}[2] a_out, {T}[2] b_out, {T}[2] y, {T}[2] z, {T}[2] wo) {
            a_out = Identity(a_in)
            s = Sin(b_in)
            p = Mul(s, a_in)
            b_out = Add(p, x)
            y = Identity(x)
            z = Identity(a_in)
            wo = Identity(w)
        }>
}
"""

LOOP_IDENTITY_TEXT = """
g (int64 M, {T}[2] a0, {T}[2] b0, {T}[2] w) => ({T}[2] a, {T}[2] b, {T}[K, 2] ys, {T}[K, 2] ws) {
    c = Constant <value = bool {1}> ()
    a, b, ys, ws = Loop (M, c, a0, b0) <
        body = lb (int64 i, bool ci, {T}[2] a_in, {T}[2] b_in) => (bool co, {T}[2] a_out, {T}[2] b_out, {T}[2] y, {T}[2] wo) {
            co = Identity(ci)
            a_out = Identity(a_in)
            s = Sin(b_in)
            b_out = Mul(s, a_in)
            y = Identity(a_in)
            wo = Identity(w)
        }>
}
"""

LOOP_DIRECT_TEXT = """
g (int64 M, {T}[2] a0, {T}[2] b0, {T}[2] w) => ({T}[2] a, {T}[2] b, {T}[K, 2] ys) {
    c = Constant <value = bool {1}> ()
    a, b, ys = Loop (M, c, a0, b0) <
        body = lb (int64 i, bool ci, {T}[2] a_in, {T}[2] b_in) => (bool ci, {T}[2] a_in, {T}[2] b_out, {T}[2] a_in) {
            s = Sin(b_in)
            p = Mul(s, a_in)
            b_out = Add(p, w)
        }>
}
"""

LOOP_ADD_TEXT = """
g (int64 M, {T}[2] a0, {T}[2] w) => ({T}[2] a) {
    c = Constant <value = bool {1}> ()
    a = Loop (M, c, a0) <
        body = lb (int64 i, bool ci, {T}[2] a_in) => (bool co, {T}[2] a_out) {
            co = Identity(ci)
            a_out = Add(a_in, w)
        }>
}
"""

IF_IDENTITY_TEXT = """
g ({T}[2] X, {T}[2] W) => ({T}[2] Y, {T}[2] Z) {
    zero = Constant <value = {T} {0}> ()
    m = ReduceMax <keepdims = 0> (X)
    c = Greater(m, zero)
    Y, Z = If (c) <
        then_branch = g1 () => ({T}[2] t1, {T}[2] t2) { t1 = Identity(X) t2 = Identity(W) },
        else_branch = g2 () => ({T}[2] e1, {T}[2] e2) { e1 = Identity(W) e2 = Identity(X) }
    >
}
"""

PASSTHROUGH_OPSETS = (11, 16, 21)
PASSTHROUGH_CASES = [
    Case("scan_add_state", SCAN_ADD_TEXT, opsets=PASSTHROUGH_OPSETS, dims={"K": 3}),
    Case("scan_identity_outputs", SCAN_IDENTITY_TEXT, opsets=PASSTHROUGH_OPSETS, dims={"K": 3}),
    Case(
        "loop_identity_outputs",
        LOOP_IDENTITY_TEXT,
        opsets=PASSTHROUGH_OPSETS,
        fixed={"M": np.array(3)},
    ),
    Case(
        "loop_body_inputs_as_outputs",
        LOOP_DIRECT_TEXT,
        opsets=PASSTHROUGH_OPSETS,
        fixed={"M": np.array(3)},
    ),
    Case("loop_add_state", LOOP_ADD_TEXT, opsets=PASSTHROUGH_OPSETS, fixed={"M": np.array(3)}),
    Case("if_identity_then", IF_IDENTITY_TEXT, opsets=PASSTHROUGH_OPSETS, fill={"X": positive}),
    Case("if_identity_else", IF_IDENTITY_TEXT, opsets=PASSTHROUGH_OPSETS, fill={"X": negative}),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(PASSTHROUGH_CASES), ids=case_id)
def test_passthrough(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)
