"""The transform contract: isolation, determinism, ordering, naming, selection, passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnax
from oracles import check_jvp, check_model_valid, run

TEXT = """
<ir_version: 10, opset_import: ["" : 18]>
g (double[N, 3] x, double[3] w, int64[2] shape) => (double y, double[N, 3] z, int64[2] s) {
    a = Mul(x, w)
    b = Tanh(a)
    z = Identity(b)
    y = ReduceSum <keepdims = 0> (b)
    s = Identity(shape)
}
"""


def model() -> ir.Model:
    return ir.from_onnx_text(TEXT)


def feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((4, 3)),
        "w": rng.standard_normal(3),
        "shape": np.array([4, 3]),
    }


TRANSFORMS = {
    "jvp": lambda m: onnax.jvp(m),
    "vjp": lambda m: onnax.vjp(m),
    "grad": lambda m: onnax.grad(m, output="y"),
    "jvp(grad)": lambda m: onnax.jvp(onnax.grad(m, output="y")),
    "jvp(jvp)": lambda m: onnax.jvp(onnax.jvp(m)),
    "vjp(jvp)": lambda m: onnax.vjp(onnax.jvp(m)),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_source_is_untouched_and_result_is_deterministic(name: str) -> None:
    m = model()
    before = ir.to_proto(m).SerializeToString()
    first = TRANSFORMS[name](m)
    assert ir.to_proto(m).SerializeToString() == before
    second = TRANSFORMS[name](m)
    assert ir.to_proto(first).SerializeToString() == ir.to_proto(second).SerializeToString()
    check_model_valid(first)
    assert first is not m


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_primal_signature_comes_first(name: str) -> None:
    m = model()
    out = TRANSFORMS[name](m)
    assert [v.name for v in out.graph.inputs][: len(m.graph.inputs)] == ["x", "w", "shape"]
    assert [v.name for v in out.graph.outputs][: len(m.graph.outputs)] == ["y", "z", "s"]
    got, want = run(out, {**feeds(), **_zero_seeds(out, m)}), run(m, feeds())
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-12)


def _zero_seeds(out: ir.Model, m: ir.Model) -> dict[str, np.ndarray]:
    seeds = {}
    for v in list(out.graph.inputs)[len(m.graph.inputs) :]:
        seeds[v.name] = np.zeros(
            [int(d) if isinstance(d, int) else 4 for d in v.shape.dims], v.dtype.numpy()
        )
    return seeds


def test_generated_names() -> None:
    m = model()
    j = onnax.jvp(m)
    assert [v.name for v in j.graph.inputs] == ["x", "w", "shape", "fwd_x", "fwd_w"]
    assert [v.name for v in j.graph.outputs] == ["y", "z", "s", "fwd_y", "fwd_z"]
    v = onnax.vjp(m, inputs=["w"], outputs=["z"])
    assert [x.name for x in v.graph.inputs] == ["x", "w", "shape", "adj_z"]
    assert [x.name for x in v.graph.outputs] == ["y", "z", "s", "adj_w"]
    g = onnax.grad(m, output="y")
    assert [x.name for x in g.graph.outputs] == ["y", "z", "s", "grad_x", "grad_w"]
    jj = onnax.jvp(j)
    assert [x.name for x in jj.graph.inputs][5:] == ["fwd2_x", "fwd2_w", "fwd2_fwd_x", "fwd2_fwd_w"]
    # The seed contract: the default differentiates the generated derivative outputs only.
    assert [x.name for x in jj.graph.outputs][5:] == ["fwd2_fwd_y", "fwd2_fwd_z"]
    jg = onnax.jvp(g)
    assert [x.name for x in jg.graph.outputs][5:] == ["fwd_grad_x", "fwd_grad_w"]
    jg_all = onnax.jvp(g, outputs=["y", "z", "grad_x", "grad_w"])
    assert [x.name for x in jg_all.graph.outputs][5:] == [
        "fwd_y",
        "fwd_z",
        "fwd_grad_x",
        "fwd_grad_w",
    ]
    gg = onnax.grad(onnax.grad(m, output="y"), output="y")
    assert [x.name for x in gg.graph.outputs][5:] == ["grad2_x", "grad2_w"]


def test_generated_name_collides_with_internal_value() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[3] x) => (double[3] y) { fwd_x = Exp(x)
         y = Sin(fwd_x) }"""
    )
    j = onnax.jvp(m)
    assert [v.name for v in j.graph.inputs] == ["x", "fwd_x"]
    check_model_valid(j)
    check_jvp(m, {"x": np.array([0.1, 0.2, 0.3])})


def test_names_are_unique_across_subgraphs_and_main_graph() -> None:
    j = onnax.jvp(onnax.jvp(model()))
    names = [v.name for g in j.graphs() for n in g for v in n.outputs]
    names += [v.name for v in j.graph.inputs]
    assert len(names) == len(set(names))


def test_untyped_tape_model_is_accepted() -> None:
    x = ir.val("x", dtype=ir.DataType.DOUBLE, shape=[2])
    w = ir.val("w", dtype=ir.DataType.DOUBLE, shape=[2])
    tape = ir.tape.Tape()
    p = tape.op("Mul", [x, w])
    loss = tape.op("ReduceSum", [tape.op("Mul", [p, p])], {"keepdims": 0})
    loss.name = "loss"
    m = ir.Model(
        ir.Graph([x, w], [loss], nodes=tape.nodes, opset_imports={"": 18}, name="g"), ir_version=10
    )
    g = onnax.grad(m, inputs=["w"], output="loss")
    check_model_valid(g)
    xv, wv = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    np.testing.assert_allclose(run(g, {"x": xv, "w": wv})["grad_w"], 2 * xv * xv * wv)
    assert loss.type is None  # the source stays untyped


def test_initializer_selected_by_name_keeps_its_value() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[2] x) => (double y) <double[2] w = {3.0, -1.0}> {
          p = Mul(x, w)
          y = ReduceSum <keepdims = 0> (p) }"""
    )
    g = onnax.grad(m)
    assert [v.name for v in g.graph.outputs] == ["y", "grad_x"]
    g = onnax.grad(m, inputs=["w", "x"])
    assert [v.name for v in g.graph.outputs] == ["y", "grad_w", "grad_x"]
    assert [v.name for v in g.graph.inputs] == ["x"]
    res = run(g, {"x": np.array([1.0, 2.0])})
    np.testing.assert_allclose(res["grad_w"], [1.0, 2.0])
    np.testing.assert_allclose(res["grad_x"], [3.0, -1.0])


def test_ir3_weights_listed_as_inputs_are_not_selected_by_default() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 3, opset_import: ["" : 11]>
        g (double[2] x, double[2] w) => (double[2] y) <double[2] w = {3.0, -1.0}> {
          y = Mul(x, w) }"""
    )
    j = onnax.jvp(m)
    assert [v.name for v in j.graph.inputs][-1:] == ["fwd_x"]
    j = onnax.jvp(m, inputs=["w"])
    res = run(j, {"x": np.array([1.0, 2.0]), "fwd_w": np.array([1.0, 1.0])})
    np.testing.assert_allclose(res["fwd_y"], [1.0, 2.0])


def test_passes_work_in_a_pass_manager() -> None:
    pm = ir.passes.PassManager([onnax.GradPass(output="y"), onnax.JvpPass(inputs=["x"])])
    m = model()
    result = pm(m)
    assert result.model is not m
    assert [v.name for v in result.model.graph.outputs][-3:] == [
        "grad_w",
        "fwd_grad_x",
        "fwd_grad_w",
    ]
    assert isinstance(onnax.VjpPass(), ir.passes.FunctionalPass)


def test_output_that_a_rule_also_computes_keeps_its_type() -> None:
    # Found by the fuzzer: Sin's tangent emits Cos(a), which is the output c; CSE kept the
    # emitted copy in c's place and the jvp model lost c's type (onnx.checker rejects it).
    m = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>'
        "g (double[4] a) => (double[4] s, double[4] c) { c = Cos (a)  s = Sin (a) }"
    )
    jm = check_jvp(m, {"a": np.random.default_rng(0).standard_normal(4)})
    assert [(v.dtype, v.shape) for v in jm.graph.outputs] == [(ir.DataType.DOUBLE, [4])] * 4


@pytest.mark.parametrize("transform", ["grad", "vjp"])
def test_zero_derivatives_of_equal_type_keep_their_own_names(transform: str) -> None:
    # Found by the fuzzer: the emitter hands out one zeros value for y and z (rank 0, same
    # type), which became both outputs: named grad_z and grad_z_alias_2, no grad_y.
    m = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>'
        "g (double y, double z, double[3] x) => (double s) { s = ReduceSum <keepdims = 0> (x) }"
    )
    out = getattr(onnax, transform)(m, ["y", "z", "x"])
    check_model_valid(out)
    prefix = "grad_" if transform == "grad" else "adj_"
    assert [v.name for v in out.graph.outputs] == ["s", *(prefix + x for x in "yzx")]
    feeds = {"y": np.array(1.0), "z": np.array(2.0), "x": np.ones(3), "adj_s": np.array(1.0)}
    res = run(out, feeds)
    assert res[prefix + "y"] == 0.0 and res[prefix + "z"] == 0.0


def test_symbolic_dimension_survives() -> None:
    g = onnax.vjp(model())
    assert str(g.graph.outputs[-2].shape[0]) == "N"
    res = run(g, {**feeds(), "adj_y": np.array(1.0), "adj_z": np.ones((4, 3))})
    assert res["adj_x"].shape == (4, 3)
    res = run(
        g,
        {
            "x": np.ones((7, 3)),
            "w": np.ones(3),
            "shape": np.array([7, 3]),
            "adj_y": np.array(1.0),
            "adj_z": np.ones((7, 3)),
        },
    )
    assert res["adj_x"].shape == (7, 3)


def test_opset_11_model_is_converted_before_transforming() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 7, opset_import: ["" : 9]>
        g (double[3] x) => (double[3] y) { y = Mul(x, x) }"""
    )
    j = onnax.jvp(m)
    assert j.opset_imports[""] >= 11
    check_jvp(m, {"x": np.array([1.0, 2.0, 3.0])})


def test_checker_failure_is_reported_first() -> None:
    bad = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[3] x) => (double[3] y) { y = Relu <alpha = 1.0> (x) }"""
    )
    # The checker's complaint comes before the (also wrong) selection.
    with pytest.raises(
        onnax.InvalidModelError, match=r"fails onnx\.checker.*alpha.*onnx\.checker\.check_model"
    ):
        onnax.jvp(bad, inputs=["nonexistent"])


def test_reverse_mode_when_inference_loses_a_shape() -> None:
    # Shape inference cannot follow the run-time axes of this reduction, so the reverse sweep must
    # find the shape of an intermediate tangent some other way.
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[N, 3] x, int64[1] axes) => (double[N, 3] y) {
          m = ReduceMean <keepdims = 1> (x, axes)
          s = Mul(m, m)
          e = Add(s, x)
          y = Sqrt(e)
        }"""
    )
    feeds = {
        "x": np.abs(np.random.default_rng(0).standard_normal((4, 3))) + 1.0,
        "axes": np.array([1]),
    }
    from oracles import check_adjoint, check_vjp

    check_vjp(m, feeds)
    check_adjoint(m, feeds)


_SIDE_OUTPUT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 3] x) => (float[4, 3] y, float s, seq(float[2, 3]) parts) {
    y = Sin(x)
    s = ReduceSum<keepdims = 0>(y)
    two = Constant<value = int64[2] {2, 2}>()
    parts = SplitToSequence(x, two)
}
"""


@pytest.mark.parametrize("transform", ["jvp", "vjp", "grad"])
def test_operators_no_selected_output_depends_on_do_not_block(transform: str) -> None:
    # SplitToSequence has no derivative rule; it feeds only an output not differentiated.
    model = ir.from_onnx_text(_SIDE_OUTPUT)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    t = rng.standard_normal((4, 3)).astype(np.float32)
    if transform == "jvp":
        out = run(onnax.jvp(model, ["x"], ["y"]), {"x": x, "fwd_x": t})
        np.testing.assert_allclose(out["fwd_y"], np.cos(x) * t, rtol=1e-5)
    elif transform == "vjp":
        out = run(onnax.vjp(model, ["x"], ["y"]), {"x": x, "adj_y": t})
        np.testing.assert_allclose(out["adj_x"], np.cos(x) * t, rtol=1e-5)
    else:
        out = run(onnax.grad(model, ["x"], output="s"), {"x": x})
        np.testing.assert_allclose(out["grad_x"], np.cos(x), rtol=1e-5)
    assert len(out["parts"]) == 2  # the sequence output is still computed


UNNAMED_CONSTANT = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[3] x) => (float[3] y, float s) {
    c = Constant <value: tensor = float {2}> ()
    y = Mul (x, c)
    s = ReduceSum <keepdims = 0> (y)
}
"""

CONTRACT_TRANSFORMS = {
    **TRANSFORMS,
    "grad": lambda m: onnax.grad(m, output=m.graph.outputs[-1].name),
    "jvp(grad)": lambda m: onnax.jvp(onnax.grad(m, output=m.graph.outputs[-1].name)),
    "vmap": lambda m: onnax.vmap(m),
    "vmap(grad)": lambda m: onnax.vmap(onnax.grad(m, output=m.graph.outputs[-1].name)),
}


@pytest.mark.parametrize("name", list(CONTRACT_TRANSFORMS))
def test_unnamed_constant_tensor_is_not_named_in_the_source(name: str) -> None:
    # Shape inference names a Constant's tensor after its output; the tensor must be the copy's.
    m = ir.from_onnx_text(UNNAMED_CONSTANT)
    before = ir.to_proto(m).SerializeToString()
    first = CONTRACT_TRANSFORMS[name](m)
    assert ir.to_proto(m).SerializeToString() == before
    again = CONTRACT_TRANSFORMS[name](m)
    reloaded = CONTRACT_TRANSFORMS[name](ir.from_proto(onnx.load_from_string(before)))
    out = ir.to_proto(first).SerializeToString()
    assert ir.to_proto(again).SerializeToString() == out
    assert ir.to_proto(reloaded).SerializeToString() == out


def test_source_tensors_of_every_storage_keep_their_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a protobuf (ir.load), on disk (external data) and in memory: renaming an initializer
    # of the copy renames its tensor, which must not be the source's.
    proto = ir.to_proto(model())
    w = np.arange(3, dtype=np.float64)
    proto.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    path = tmp_path / "m.onnx"
    onnx.save_model(proto, path, save_as_external_data=True, size_threshold=0)
    monkeypatch.chdir(tmp_path)  # external data resolved from anywhere is tested in test_cli
    for source in (ir.load(path), ir.from_proto(proto)):
        before = ir.to_proto(source).SerializeToString()
        names = [t.const_value.name for t in source.graph.initializers.values()]
        onnax.jvp(onnax.grad(source, output="y"))
        assert [t.const_value.name for t in source.graph.initializers.values()] == names
        assert ir.to_proto(source).SerializeToString() == before


def test_tensor_shared_by_two_constants_gives_the_model_of_its_reload() -> None:
    # One tensor object in two Constant nodes (as a rule's cached constant in a loop body and
    # in its copy): inference names it after each output in turn, a reloaded model has two.
    x = ir.val("x", dtype=ir.DataType.FLOAT, shape=[3])
    two = ir.tensor(np.array([2.0], np.float32))
    nodes = [
        ir.node("Constant", [], {"value": two}, outputs=[ir.val("c1")]),
        ir.node("Constant", [], {"value": two}, outputs=[ir.val("c2")]),
    ]
    a = ir.node("Mul", [x, nodes[0].outputs[0]], outputs=[ir.val("a")])
    y = ir.node("Mul", [a.outputs[0], nodes[1].outputs[0]], outputs=[ir.val("y")])
    graph = ir.Graph([x], [y.outputs[0]], nodes=[*nodes, a, y], opset_imports={"": 18}, name="g")
    m = ir.Model(graph, ir_version=10)
    before = ir.to_proto(m).SerializeToString()
    out = ir.to_proto(onnax.jvp(m)).SerializeToString()
    assert ir.to_proto(m).SerializeToString() == before
    reloaded = onnax.jvp(ir.from_proto(onnx.load_from_string(before)))
    assert ir.to_proto(reloaded).SerializeToString() == out
