"""The simplification run after every transform: each rewrite on small graphs, against onnxruntime.

Every test builds a model, runs :func:`onnax.passes.cleanup.cleanup` (what each transform ends
with) on a copy and compares onnxruntime's results before and after, bit for bit: the rewrites
are exact. The negative cases check what must stay (a narrowing-then-widening Cast, a graph
output's name and type, two subgraph outputs as two values, a weight read only by a foldable
node), and a fuzz runs random chains of the rewritten operators.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

import onnax
from onnax.core.inference import RANK_GUESSED
from onnax.core.static import constant_of
from onnax.passes.cleanup import cleanup
from onnax.passes.simplify import _cast_skippable
from oracles import check_model_valid, run

F32 = onnx.TensorProto.FLOAT
OPSET = 18


def model_of(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Sequence[int | str]]],
    outputs: Sequence[tuple[str, int, Sequence[int | str] | None]],
    initializers: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    graph = oh.make_graph(
        list(nodes),
        "g",
        [oh.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [oh.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=list(initializers),
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)], ir_version=10)


def ints(name: str, values: Sequence[int]) -> onnx.NodeProto:
    return oh.make_node(
        "Constant",
        [],
        [name],
        value=oh.make_tensor(name, onnx.TensorProto.INT64, [len(values)], values),
    )


def simplified(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> ir.Model:
    """``cleanup`` of the model, checked: valid, same outputs (names, types, values)."""
    before = ir.from_proto(proto)
    after = ir.from_proto(proto)
    # As prepare records it when shape inference guessed no rank: the annotated shapes hold.
    after.graph.meta[RANK_GUESSED] = False
    after = cleanup(after)
    check_model_valid(after)
    assert [(v.name, v.type) for v in after.graph.outputs] == [
        (v.name, v.type) for v in before.graph.outputs
    ]
    want, got = run(before, feeds), run(after, feeds)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    return after


def ops(model: ir.Model) -> collections.Counter[str]:
    """The operators that compute (Constant nodes left out)."""
    return collections.Counter(
        n.op_type for g in model.graphs() for n in g if n.op_type != "Constant"
    )


RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def test_transpose_pair_composes_and_identity_perm_goes() -> None:
    nodes = [
        oh.make_node("Relu", ["x"], ["h"]),
        oh.make_node("Transpose", ["h"], ["t1"], perm=[1, 0, 2]),
        oh.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1]),  # composed: (1, 2, 0)
        oh.make_node("Transpose", ["t2"], ["t3"], perm=[2, 0, 1]),  # composed: identity
        oh.make_node("Neg", ["t3"], ["y"]),
        oh.make_node("Neg", ["t2"], ["z"]),
    ]
    proto = model_of(nodes, [("x", F32, [2, 3, 4])], [("y", F32, None), ("z", F32, None)])
    m = simplified(proto, {"x": X})
    assert ops(m)["Transpose"] == 1
    (t,) = [n for n in m.graph if n.op_type == "Transpose"]
    assert list(t.attributes["perm"].as_ints()) == [1, 2, 0]
    assert t.inputs[0].producer().op_type == "Relu"


def test_transpose_chain_feeding_an_output_keeps_its_name_and_type() -> None:
    nodes = [
        oh.make_node("Relu", ["x"], ["h"]),
        oh.make_node("Transpose", ["h"], ["t"], perm=[2, 0, 1]),
        oh.make_node("Transpose", ["t"], ["y"], perm=[1, 2, 0]),
        # From a graph input straight to an output: an Identity must stay.
        oh.make_node("Transpose", ["x"], ["u"], perm=[1, 0, 2]),
        oh.make_node("Transpose", ["u"], ["w"], perm=[1, 0, 2]),
    ]
    proto = model_of(nodes, [("x", F32, [2, 3, 4])], [("y", F32, [2, 3, 4]), ("w", F32, [2, 3, 4])])
    m = simplified(proto, {"x": X})
    assert ops(m) == {"Relu": 1, "Identity": 1}
    y, w = m.graph.outputs
    assert y.producer().op_type == "Relu" and y.shape == ir.Shape([2, 3, 4])
    assert w.producer().op_type == "Identity" and w.producer().inputs[0] is m.graph.inputs[0]


def test_two_outputs_stay_two_values() -> None:
    nodes = [
        oh.make_node("Relu", ["x"], ["y"]),
        oh.make_node("Identity", ["y"], ["z"]),
        oh.make_node("Transpose", ["y"], ["t"], perm=[1, 0, 2]),
        oh.make_node("Transpose", ["t"], ["w"], perm=[1, 0, 2]),
    ]
    outs = [("y", F32, None), ("z", F32, None), ("w", F32, None)]
    m = simplified(model_of(nodes, [("x", F32, [2, 3, 4])], outs), {"x": X})
    assert len(set(m.graph.outputs)) == 3
    assert [v.name for v in m.graph.outputs] == ["y", "z", "w"]


def test_reshape_chain_reads_the_first_input() -> None:
    nodes = [
        ints("s1", [6, 4]),
        ints("s2", [4, 6]),
        ints("s3", [2, 12]),
        ints("ax", [0]),
        oh.make_node("Reshape", ["x", "s1"], ["r1"]),
        oh.make_node("Unsqueeze", ["r1", "ax"], ["u"]),
        oh.make_node("Reshape", ["u", "s2"], ["r2"]),
        oh.make_node("Reshape", ["r2", "s3"], ["y"]),
    ]
    proto = model_of(nodes, [("x", F32, [2, 3, 4])], [("y", F32, None)])
    m = simplified(proto, {"x": X})
    assert ops(m) == {"Reshape": 1}
    (reshape,) = [n for n in m.graph if n.op_type == "Reshape"]
    assert reshape.inputs[0] is m.graph.inputs[0]


def test_reshape_reads_past_a_transpose_of_unit_axes() -> None:
    # Moving axes of size 1 keeps the elements' order (the depthwise Conv's input gradient
    # regroups its [C, 1, k] weights by Reshape, Transpose of unit axes, Reshape).
    w = RNG.standard_normal((3, 1, 2, 4)).astype(np.float32)
    nodes = [
        ints("s1", [3, 1, 1, 2, 4]),
        ints("s2", [3, 2, 4]),
        ints("s3", [6, 4]),
        oh.make_node("Reshape", ["x", "s1"], ["r1"]),
        oh.make_node("Transpose", ["r1"], ["t"], perm=[0, 2, 1, 3, 4]),
        oh.make_node("Reshape", ["t", "s2"], ["y"]),
        oh.make_node("Transpose", ["x"], ["u"], perm=[1, 0, 2, 3]),
        oh.make_node("Reshape", ["u", "s3"], ["z"]),
    ]
    proto = model_of(nodes, [("x", F32, [3, 1, 2, 4])], [("y", F32, None), ("z", F32, None)])
    m = simplified(proto, {"x": w})
    assert ops(m) == {"Reshape": 2}
    assert all(n.inputs[0] is m.graph.inputs[0] for n in m.graph if n.op_type == "Reshape")


def test_reshape_keeps_a_transpose_of_sized_axes() -> None:
    w = RNG.standard_normal((2, 3, 1)).astype(np.float32)
    nodes = [
        ints("s", [6]),
        oh.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 0]),
        oh.make_node("Reshape", ["t", "s"], ["y"]),
    ]
    proto = model_of(nodes, [("x", F32, [2, 3, 1])], [("y", F32, None)])
    m = simplified(proto, {"x": w})
    assert ops(m) == {"Transpose": 1, "Reshape": 1}


def test_reshape_with_zero_keeps_its_producer() -> None:
    # 0 copies a dimension of the Reshape's own input: reading further up would change it.
    nodes = [
        ints("s1", [3, 2, 4]),
        ints("s2", [0, -1]),
        oh.make_node("Reshape", ["x", "s1"], ["r1"]),
        oh.make_node("Reshape", ["r1", "s2"], ["y"]),
    ]
    proto = model_of(nodes, [("x", F32, [2, 3, 4])], [("y", F32, None)])
    m = simplified(proto, {"x": X})
    assert ops(m) == {"Reshape": 2}


def test_unsqueeze_and_squeeze_pairs() -> None:
    nodes = [
        ints("a", [0, 2]),
        ints("b", [1, -1]),
        ints("c", [-2]),
        oh.make_node("Relu", ["x"], ["h"]),
        oh.make_node("Unsqueeze", ["h", "a"], ["u1"]),  # [1, 2, 1, 3, 4]
        oh.make_node("Unsqueeze", ["u1", "b"], ["u2"]),  # [1, 1, 2, 1, 3, 4, 1]
        oh.make_node("Neg", ["u2"], ["y"]),
        oh.make_node("Unsqueeze", ["h", "c"], ["v"]),  # [2, 3, 1, 4]
        oh.make_node("Squeeze", ["v", "c"], ["w"]),
        oh.make_node("Neg", ["w"], ["z"]),
    ]
    proto = model_of(nodes, [("x", F32, [2, 3, 4])], [("y", F32, None), ("z", F32, None)])
    m = simplified(proto, {"x": X})
    assert ops(m) == {"Relu": 1, "Unsqueeze": 1, "Neg": 2}
    (u,) = [n for n in m.graph if n.op_type == "Unsqueeze"]
    assert constant_of(u.inputs[1]).tolist() == [0, 1, 3, 6]


def test_squeeze_then_unsqueeze_of_the_same_axes_is_the_identity() -> None:
    x = RNG.standard_normal((2, 1, 4)).astype(np.float32)
    nodes = [
        ints("a", [1]),
        oh.make_node("Squeeze", ["x", "a"], ["s"]),
        oh.make_node("Unsqueeze", ["s", "a"], ["u"]),
        oh.make_node("Neg", ["u"], ["y"]),
    ]
    m = simplified(model_of(nodes, [("x", F32, [2, 1, 4])], [("y", F32, None)]), {"x": x})
    assert ops(m) == {"Neg": 1}


def cast_chain(src: int, mid: int, dst: int) -> onnx.ModelProto:
    nodes = [
        oh.make_node("Cast", ["x"], ["c1"], to=mid),
        oh.make_node("Cast", ["c1"], ["c2"], to=dst),
        oh.make_node("Identity", ["c2"], ["y"]),
    ]
    return model_of(nodes, [("x", src, [5])], [("y", dst, [5])])


def test_widening_then_narrowing_back_is_the_identity() -> None:
    tp = onnx.TensorProto
    x = np.array([1e-8, 1.0 / 3.0, -2.5, 3e38, np.inf], np.float32)
    m = simplified(cast_chain(tp.FLOAT, tp.DOUBLE, tp.FLOAT), {"x": x})
    assert ops(m) == {"Identity": 1}  # x in, y out: one Identity keeps the two names apart
    i8 = np.array([-128, -1, 0, 1, 127], np.int8)
    m = simplified(cast_chain(tp.INT8, tp.INT32, tp.INT16), {"x": i8})
    assert ops(m) == {"Cast": 1}


def test_narrowing_then_widening_is_kept() -> None:
    tp = onnx.TensorProto
    x = np.array([1e-8, 1.0 / 3.0, -2.5, 7e4, np.inf], np.float32)
    m = simplified(cast_chain(tp.FLOAT, tp.FLOAT16, tp.FLOAT), {"x": x})
    assert ops(m)["Cast"] == 2
    # An integer through a float to a narrower integer: the wrap-around is not the float's.
    i16 = np.array([-32768, -200, 0, 300, 32767], np.int16)
    m = simplified(cast_chain(tp.INT16, tp.FLOAT, tp.INT8), {"x": i16})
    assert ops(m)["Cast"] == 2


TYPES = [
    onnx.TensorProto.BOOL,
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
]


def edge_values(dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        return np.array([True, False, True, False, True])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([info.min, info.max, 0, 1, info.max // 3], dtype)
    # Floats in the range of every integer type: outside it, a float's conversion is undefined.
    return np.array([-100.75, -1.5, 0.0, 0.5, 126.25], dtype)


@pytest.mark.parametrize("src", TYPES, ids=lambda t: onnx.TensorProto.DataType.Name(t))
def test_every_skipped_cast_pair_is_exact(src: int) -> None:
    """Where the table says ``Cast(Cast(x, mid), dst) == Cast(x, dst)``, onnxruntime agrees."""
    nodes, outputs = [], []
    for mid in TYPES:
        for dst in TYPES:
            if not _cast_skippable(*(ir.DataType(t) for t in (src, mid, dst))):
                continue
            k = f"{mid}_{dst}"
            nodes += [
                oh.make_node("Cast", ["x"], [f"m{k}"], to=mid),
                oh.make_node("Cast", [f"m{k}"], [f"two{k}"], to=dst),
                oh.make_node("Cast", ["x"], [f"one{k}"], to=dst),
            ]
            outputs += [(f"two{k}", dst, [5]), (f"one{k}", dst, [5])]
    proto = model_of(nodes, [("x", src, [5])], outputs)
    x = edge_values(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(src)))
    results = run(ir.from_proto(proto), {"x": x})
    for name, value in results.items():
        if name.startswith("two"):
            np.testing.assert_array_equal(value, results["one" + name[3:]], err_msg=name)
    # And the pass does skip them: no Cast reads a Cast afterwards.
    m = simplified(proto, {"x": x})
    assert not any(
        n.op_type == "Cast" and n.inputs[0].producer() and n.inputs[0].producer().op_type == "Cast"
        for n in m.graph
    )


def test_shape_arithmetic_on_static_shapes_folds() -> None:
    nodes = [
        ints("i0", [0]),
        ints("m1", [-1]),
        oh.make_node("Relu", ["x"], ["h"]),
        oh.make_node("Shape", ["h"], ["s"]),
        oh.make_node("Gather", ["s", "i0"], ["b"]),
        oh.make_node("Concat", ["b", "m1"], ["shape"], axis=0),
        oh.make_node("Reshape", ["h", "shape"], ["y"]),
        oh.make_node("Size", ["h"], ["n"]),
        oh.make_node("Cast", ["n"], ["nf"], to=F32),
        oh.make_node("Div", ["y", "nf"], ["z"]),
    ]
    proto = model_of(nodes, [("x", F32, [2, 3, 4])], [("z", F32, None)])
    m = simplified(proto, {"x": X})
    assert ops(m) == {"Relu": 1, "Reshape": 1, "Div": 1}
    (reshape,) = [n for n in m.graph if n.op_type == "Reshape"]
    assert constant_of(reshape.inputs[1]).tolist() == [2, -1]


def test_shape_of_a_dynamic_dimension_stays() -> None:
    nodes = [
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("ConstantOfShape", ["s"], ["y"]),
    ]
    proto = model_of(nodes, [("x", F32, ["n", 3])], [("y", F32, ["n", 3])])
    m = simplified(proto, {"x": X[:, :, 0]})
    assert ops(m) == {"Shape": 1, "ConstantOfShape": 1}


def test_large_results_are_not_folded() -> None:
    nodes = [ints("s", [100, 100]), oh.make_node("ConstantOfShape", ["s"], ["c"])]
    nodes.append(oh.make_node("Add", ["x", "c"], ["y"]))
    proto = model_of(nodes, [("x", F32, [100, 100])], [("y", F32, None)])
    m = simplified(proto, {"x": np.ones((100, 100), np.float32)})
    assert ops(m)["ConstantOfShape"] == 1


def test_values_of_initializers_are_not_folded() -> None:
    """An initializer is a parameter a later transform may select: Transpose(W) stays.

    Folded, it left jvp(grad(m, W), W) without the tangent through W (half-precision HVP of a
    CNN off by 56 %).
    """
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    nodes = [
        oh.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        oh.make_node("MatMul", ["x", "wt"], ["h"]),
        oh.make_node("Mul", ["h", "h"], ["sq"]),
        oh.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    init = oh.make_tensor("w", F32, [4, 3], w.tolist())
    proto = model_of(nodes, [("x", F32, [2, 3])], [("loss", F32, [])], [init])
    # The Hessian-vector product w.r.t. w: loss = sum((x wᵀ)²), grad = 2 (x wᵀ)ᵀ x, whose
    # derivative along v is 2 (x vᵀ)ᵀ x.
    g = onnax.grad(ir.from_proto(proto), inputs=["w"], output="loss")
    h = onnax.jvp(g, inputs=["w"], outputs=["grad_w"])
    x, v = X[:, :, 0], RNG.standard_normal((4, 3)).astype(np.float32)
    got = run(h, {"x": x, "fwd_w": v})
    hvp = next(name for name in got if name.startswith("fwd_"))
    np.testing.assert_allclose(got[hvp], 2 * (x @ v.T).T @ x, rtol=1e-5, atol=1e-5)
    m = simplified(proto, {"x": x})
    assert ops(m)["Transpose"] == 1 and "w" in m.graph.initializers


def scan_model(tail: str) -> onnx.ModelProto:
    """A Scan whose body has two outputs: ``s`` and ``Identity(s)`` (or ``Transpose`` twice)."""
    if tail == "identity":
        twin = [oh.make_node("Identity", ["s1"], ["y1"])]
    else:
        twin = [
            oh.make_node("Transpose", ["s1"], ["t1"], perm=[1, 0]),
            oh.make_node("Transpose", ["t1"], ["y1"], perm=[1, 0]),
        ]
    body = oh.make_graph(
        [oh.make_node("Add", ["s0", "x0"], ["s1"]), *twin],
        "body",
        [
            oh.make_tensor_value_info("s0", F32, [2, 2]),
            oh.make_tensor_value_info("x0", F32, [2, 2]),
        ],
        [
            oh.make_tensor_value_info("s1", F32, [2, 2]),
            oh.make_tensor_value_info("y1", F32, [2, 2]),
        ],
    )
    nodes = [oh.make_node("Scan", ["init", "xs"], ["final", "ys"], body=body, num_scan_inputs=1)]
    return model_of(
        nodes,
        [("init", F32, [2, 2]), ("xs", F32, [3, 2, 2])],
        [("final", F32, [2, 2]), ("ys", F32, [3, 2, 2])],
    )


@pytest.mark.parametrize("tail", ["identity", "transposes"])
def test_a_subgraph_output_is_not_merged_into_another(tail: str) -> None:
    feeds = {
        "init": RNG.standard_normal((2, 2)).astype(np.float32),
        "xs": RNG.standard_normal((3, 2, 2)).astype(np.float32),
    }
    m = simplified(scan_model(tail), feeds)
    (scan,) = [n for n in m.graph if n.op_type == "Scan"]
    body = scan.attributes["body"].as_graph()
    assert len(set(body.outputs)) == 2
    assert [v.name for v in body.outputs] == ["s1", "y1"]


def test_transforms_end_smaller_and_exact() -> None:
    """The vjp of a Reshape/Transpose/Unsqueeze model: the adjoint chain collapses."""
    nodes = [
        ints("s", [6, 4]),
        ints("a", [0]),
        oh.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        oh.make_node("Reshape", ["t", "s"], ["r"]),
        oh.make_node("Unsqueeze", ["r", "a"], ["u"]),
        oh.make_node("Tanh", ["u"], ["y"]),
    ]
    proto = model_of(nodes, [("x", F32, [2, 3, 4])], [("y", F32, [1, 6, 4])])
    v = onnax.vjp(ir.from_proto(proto), inputs=["x"])
    check_model_valid(v)
    # The cotangent's path: Unsqueeze's and Reshape's adjoints are one Reshape.
    seen, todo = set(), [v.graph.inputs[1]]
    while todo:
        for use in todo.pop().uses():
            if use.node not in seen:
                seen.add(use.node)
                todo.extend(use.node.outputs)
    backward = collections.Counter(n.op_type for n in seen)
    assert backward["Reshape"] == 1 and backward["Transpose"] == 1, backward
    assert backward["Squeeze"] == backward["Unsqueeze"] == 0, backward
    u = RNG.standard_normal((1, 6, 4)).astype(np.float32)
    got = run(v, {"x": X, "adj_y": u})[v.graph.outputs[1].name]
    # numpy reference: d tanh = 1 - tanh², then the reshapes back.
    t = np.tanh(np.transpose(X, (1, 0, 2)).reshape(1, 6, 4))
    want = np.transpose(((1 - t * t) * u).reshape(3, 2, 4), (1, 0, 2))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# -- fuzz ---------------------------------------------------------------------------------------


def random_chain(seed: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A random chain of the rewritten operators on one tensor, some steps also outputs."""
    rng = np.random.default_rng(seed)
    shape = [int(d) for d in rng.integers(1, 4, size=int(rng.integers(2, 4)))]
    first = list(shape)
    nodes: list[onnx.NodeProto] = []
    outputs: list[tuple[str, int, Sequence[int | str] | None]] = []
    current, dtype, k = "x", F32, 0

    def fresh() -> str:
        nonlocal k
        k += 1
        return f"v{k}"

    for _ in range(int(rng.integers(3, 10))):
        op = rng.choice(
            [
                "Transpose",
                "Reshape",
                "Unsqueeze",
                "Squeeze",
                "Cast",
                "Identity",
                "ShapeReshape",
                "Neg",
            ]
        )
        out = fresh()
        if op == "Transpose":
            perm = [int(p) for p in rng.permutation(len(shape))]
            nodes.append(oh.make_node("Transpose", [current], [out], perm=perm))
            shape = [shape[p] for p in perm]
        elif op == "Reshape":
            size = int(np.prod(shape))
            target = [d for d in (1, 2, 3, 4, 6) if size % d == 0]
            lead = int(rng.choice(target))
            shape = [lead, size // lead]
            if rng.random() < 0.5:
                shape = [shape[0], 1, shape[1]]
            name = fresh()
            nodes += [ints(name, shape), oh.make_node("Reshape", [current, name], [out])]
        elif op == "Unsqueeze":
            rank = len(shape) + 1
            axis = int(rng.integers(-rank, rank))
            name = fresh()
            nodes += [ints(name, [axis]), oh.make_node("Unsqueeze", [current, name], [out])]
            shape.insert(axis % rank, 1)
        elif op == "Squeeze":
            ones = [i for i, d in enumerate(shape) if d == 1]
            if not ones or len(shape) == 1:
                continue
            axis = int(rng.choice(ones))
            name = fresh()
            nodes += [ints(name, [axis]), oh.make_node("Squeeze", [current, name], [out])]
            shape.pop(axis)
        elif op == "Cast":
            to = int(rng.choice([F32, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16]))
            nodes.append(oh.make_node("Cast", [current], [out], to=to))
            dtype = to
        elif op == "Identity":
            nodes.append(oh.make_node("Identity", [current], [out]))
        elif op == "ShapeReshape":
            s, g, c = fresh(), fresh(), fresh()
            idx, rest = fresh(), fresh()
            nodes += [
                oh.make_node("Shape", [current], [s]),
                ints(idx, [0]),
                oh.make_node("Gather", [s, idx], [g]),
                ints(rest, [-1]),
                oh.make_node("Concat", [g, rest], [c], axis=0),
                oh.make_node("Reshape", [current, c], [out]),
            ]
            shape = [shape[0], int(np.prod(shape[1:]))]
        else:
            nodes.append(oh.make_node("Neg", [current], [out]))
        current = out
        if rng.random() < 0.25:
            outputs.append((current, dtype, None))
    if not outputs or outputs[-1][0] != current:
        outputs.append((current, dtype, None))
    proto = model_of(nodes, [("x", F32, first)], outputs)
    return proto, {"x": rng.standard_normal(first).astype(np.float32)}


@pytest.mark.parametrize("seed", range(40))
def test_fuzz_random_chains(seed: int) -> None:
    proto, feeds = random_chain(seed)
    before = sum(1 for _ in proto.graph.node)
    m = simplified(proto, feeds)
    assert sum(1 for g in m.graphs() for _ in g) <= before
