"""onnax.training.step against torch.optim trajectories, and its layout, helpers and errors.

The trajectories (tests/data/training/optimizers.*, made by make_refs.py with torch) hold the
initial weights of a small MLP, one batch per step, and the loss and every parameter after each
of five steps of each configuration. The training model runs those steps in onnxruntime, fed
back its own outputs through ``carry``, and must follow the same path to float32 rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

from onnax import training
from onnax.errors import SelectionError
from oracles import check_model_valid
from training_models import load_meta, load_refs, mlp, run_all, session

REFS = load_refs("optimizers")
META = load_meta("optimizers")
CASES: list[dict[str, Any]] = META["cases"]
STEPS: int = META["steps"]
PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
RTOL, ATOL = 2e-5, 2e-6


def reference_model(kind: str = "cross_entropy") -> ir.Model:
    init = {k: REFS[f"init/{k}"] for k in PARAMS}
    return training.add_loss(mlp(init=init), "Y", kind)


def optimizer_of(case: dict[str, Any]) -> training.Optimizer:
    args = dict(case["args"])
    if "betas" in args:
        args["betas"] = tuple(args["betas"])
    cls = {"SGD": training.SGD, "Adam": training.Adam, "AdamW": training.AdamW}[case["optimizer"]]
    return cls(**args)


def targets(case: dict[str, Any], s: int) -> np.ndarray:
    return REFS["values"][s] if case.get("loss") == "mse" else REFS["labels"][s]


def step_model(case: dict[str, Any]) -> ir.Model:
    return training.step(
        reference_model(case.get("loss", "cross_entropy")),
        frozen=case.get("frozen", ()),
        optimizer=optimizer_of(case),
        max_grad_norm=case.get("max_grad_norm"),
    )


def check_step(
    case: dict[str, Any], s: int, loss: np.ndarray, params: dict[str, np.ndarray]
) -> None:
    name = case["name"]
    np.testing.assert_allclose(loss, REFS[f"{name}/loss/{s}"], rtol=RTOL, err_msg=f"loss {s}")
    for p in PARAMS:
        np.testing.assert_allclose(
            params[p], REFS[f"{name}/{p}/{s}"], rtol=RTOL, atol=ATOL, err_msg=f"{p} step {s}"
        )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_follows_torch_optim(case: dict[str, Any]) -> None:
    model = step_model(case)
    check_model_valid(model)
    assert {n.domain for n in model.graph.all_nodes()} == {""}
    sess = session(model)
    state = training.initial_state(model)
    pairs = training.carry(model)
    frozen = [p for p in PARAMS if p.startswith("fc1")] if case.get("frozen") else []
    for s in range(STEPS):
        feeds = {"X": REFS["x"][s], "target": targets(case, s), **state}
        if "lrs" in case:
            feeds["lr"] = np.array(case["lrs"][s], np.float32)
        out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
        state = {i: out[o] for i, o in pairs}
        params = {p: state[p] if p in state else REFS[f"init/{p}"] for p in PARAMS}
        check_step(case, s, out["loss"], params)
    assert all(p not in state for p in frozen)
    assert state["step"] == STEPS


def test_layout_of_adamw_step() -> None:
    source = reference_model()
    before = ir.to_proto(source).SerializeToString()
    model = training.step(source, frozen="fc1.*", optimizer=training.AdamW())
    assert ir.to_proto(source).SerializeToString() == before
    inputs = [v.name for v in model.graph.inputs]
    assert inputs == [
        "X", "target", "fc2.weight", "fc2.bias", "step", "lr",
        "fc2.weight.exp_avg", "fc2.weight.exp_avg_sq", "fc2.bias.exp_avg", "fc2.bias.exp_avg_sq",
    ]  # fmt: skip
    outputs = [v.name for v in model.graph.outputs]
    assert outputs == ["loss", "fc2.weight.new", "fc2.bias.new", "fc2.weight.exp_avg.new",
                       "fc2.weight.exp_avg_sq.new", "fc2.bias.exp_avg.new",
                       "fc2.bias.exp_avg_sq.new", "step.new"]  # fmt: skip
    assert {"fc1.weight", "fc1.bias"} <= set(model.graph.initializers)
    state = training.initial_state(model)
    assert set(state) == {i for i, _ in training.carry(model)}
    np.testing.assert_array_equal(state["fc2.weight"], REFS["init/fc2.weight"])
    assert not state["fc2.bias.exp_avg_sq"].any() and state["step"] == 0
    assert state["step"].dtype == np.int64


def test_lr_input_has_the_optimizer_default() -> None:
    model = training.step(reference_model(), optimizer=training.SGD(lr=0.1))
    feeds = {"X": REFS["x"][0], "target": REFS["labels"][0], **training.initial_state(model)}
    default = run_all(model, feeds)
    explicit = run_all(model, {**feeds, "lr": np.array(0.1, np.float32)})
    other = run_all(model, {**feeds, "lr": np.array(0.2, np.float32)})
    np.testing.assert_array_equal(default["fc1.weight.new"], explicit["fc1.weight.new"])
    np.testing.assert_allclose(
        other["fc1.weight.new"] - feeds["fc1.weight"],
        2 * (default["fc1.weight.new"] - feeds["fc1.weight"]),
        rtol=1e-5, atol=1e-7,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["adam", "sgd_momentum_dampening_wd", "adamw_clip"])
def test_accumulation_of_two_halves_follows_torch_full_batch(name: str) -> None:
    """Two micro-batches of 4 and one apply make the torch step on the batch of 8."""
    case = next(c for c in CASES if c["name"] == name)
    micro, apply = training.accumulation(
        reference_model(),
        optimizer=optimizer_of(case),
        max_grad_norm=case.get("max_grad_norm"),
    )
    check_model_valid(micro)
    check_model_valid(apply)
    assert {n.domain for m in (micro, apply) for n in m.graph.all_nodes()} == {""}
    micro_sess, apply_sess = session(micro), session(apply)
    micro_names = [o.name for o in micro_sess.get_outputs()]
    apply_names = [o.name for o in apply_sess.get_outputs()]
    state = training.initial_state(apply)
    for s in range(3):
        sums = {k: v for k, v in training.initial_state(micro).items() if k.endswith(".grad_sum")}
        losses = []
        for half in (slice(0, 4), slice(4, 8)):
            feeds = {"X": REFS["x"][s][half], "target": REFS["labels"][s][half]}
            feeds.update({p: state[p] for p in PARAMS}, **sums)
            out = dict(zip(micro_names, micro_sess.run(None, feeds), strict=True))
            sums = {i: out[o] for i, o in training.carry(micro)}
            losses.append(out["loss"])
        feeds = {**state, **sums, "micro_batches": np.array(2, np.int64)}
        if "lrs" in case:
            feeds["lr"] = np.array(case["lrs"][s], np.float32)
        out = dict(zip(apply_names, apply_sess.run(None, feeds), strict=True))
        state = {i: out[o] for i, o in training.carry(apply)}
        check_step(case, s, np.mean(losses), {p: state[p] for p in PARAMS})


def half_setup(dtype: type = np.float16) -> tuple[ir.Model, dict[str, np.ndarray]]:
    init = {k: REFS[f"init/{k}"].astype(dtype) for k in PARAMS}
    model = training.add_loss(mlp(init=init, dtype=dtype), "Y", "mse")
    x = REFS["x"][0].astype(dtype)
    return model, {"X": x, "target": REFS["values"][0]}


def test_half_parameters_train_as_float_master_weights() -> None:
    model, batch = half_setup()
    st = training.step(model, optimizer=training.SGD(lr=1e-4))
    check_model_valid(st)
    inputs = {v.name: v for v in st.graph.inputs}
    assert all(inputs[p].dtype == ir.DataType.FLOAT for p in PARAMS)
    state = training.initial_state(st)
    assert state["fc1.weight"].dtype == np.float32
    np.testing.assert_array_equal(state["fc1.weight"], REFS["init/fc1.weight"].astype(np.float16))
    out = run_all(st, {**batch, **state})
    # The float32 reference: the same step on the widened model.
    wide = {k: v.astype(np.float32) for k, v in {**batch}.items()}
    model32 = training.add_loss(
        mlp(init={k: state[k] for k in PARAMS}),
        "Y",
        "mse",
    )
    step32 = training.step(model32, optimizer=training.SGD(lr=1e-4))
    ref = run_all(step32, {**wide, **training.initial_state(step32)})
    for p in PARAMS:
        delta, want = out[f"{p}.new"] - state[p], ref[f"{p}.new"] - state[p]
        assert np.linalg.norm(delta - want) <= 16 * 2.0**-10 * np.linalg.norm(want)
    # Updates below half an fp16 ulp survive in the master weights, not in the fp16 weights.
    lost = out["fc1.weight.new"].astype(np.float16) == state["fc1.weight"].astype(np.float16)
    kept = out["fc1.weight.new"] != state["fc1.weight"]
    assert (lost & kept).mean() > 0.5


def test_loss_scale_rescues_underflowing_fp16_gradients() -> None:
    """Per-example weights of 1e-7 make the cotangent of the fp16 output ~1e-8, below the
    smallest fp16 subnormal: it flushes to zero unless the loss is scaled before the sweep."""
    init = {k: REFS[f"init/{k}"] for k in PARAMS}
    feeds = {"X": REFS["x"][0], "target": REFS["values"][0], "weight": np.full(8, 1e-7, np.float32)}
    sgd = training.SGD(lr=1e4)  # so that updates of ~1e-4 show in the master weights

    def delta(model: ir.Model, x_dtype: type, **kwargs: Any) -> np.ndarray:
        st = training.step(model, params="fc2.*", optimizer=sgd, **kwargs)
        state = training.initial_state(st)
        out = run_all(st, {**feeds, "X": feeds["X"].astype(x_dtype), **state})
        return out["fc2.weight.new"] - state["fc2.weight"]

    half = mlp(init={k: v.astype(np.float16) for k, v in init.items()}, dtype=np.float16)
    half_loss = training.add_loss(half, "Y", "mse", weight="weight")
    wide = mlp(init={k: v.astype(np.float16).astype(np.float32) for k, v in init.items()})
    reference = delta(training.add_loss(wide, "Y", "mse", weight="weight"), np.float32)
    plain = delta(half_loss, np.float16)
    scaled = delta(half_loss, np.float16, loss_scale=2.0**16)
    assert np.abs(reference).min() > 0
    assert not plain.any()
    assert np.linalg.norm(scaled - reference) <= 16 * 2.0**-10 * np.linalg.norm(reference)


def test_bfloat16_step_against_the_float_step() -> None:
    """onnxruntime has no BFLOAT16 kernels; onnx's reference evaluator runs the step."""
    import ml_dtypes
    import onnx
    from onnx.reference import ReferenceEvaluator

    model, batch = half_setup(ml_dtypes.bfloat16)
    st = training.step(model, optimizer=training.SGD(lr=0.1))
    onnx.checker.check_model(ir.to_proto(st), full_check=True)
    assert training.layout(st)["params"]["fc1.weight"]["dtype"] == "BFLOAT16"
    state = training.initial_state(st)
    ref = ReferenceEvaluator(ir.to_proto(st))
    got = dict(zip(ref.output_names, ref.run(None, {**batch, **state}), strict=True))
    wide = training.add_loss(mlp(init={p: state[p] for p in PARAMS}), "Y", "mse")
    st32 = training.step(wide, optimizer=training.SGD(lr=0.1))
    want = run_all(st32, {"X": batch["X"].astype(np.float32), "target": batch["target"],
                          **training.initial_state(st32)})  # fmt: skip
    for p in PARAMS:
        assert got[f"{p}.new"].dtype == np.float32
        d_got, d_want = got[f"{p}.new"] - state[p], want[f"{p}.new"] - state[p]
        assert np.linalg.norm(d_got - d_want) <= 16 * 2.0**-7 * np.linalg.norm(d_want)


def test_trained_model_writes_weights_back(tmp_path: Any) -> None:
    source = mlp(init={k: REFS[f"init/{k}"] for k in PARAMS})
    st = training.step(training.add_loss(source, "Y", "cross_entropy"),
                       optimizer=training.SGD(lr=0.5))  # fmt: skip
    state = training.initial_state(st)
    out = run_all(st, {"X": REFS["x"][0], "target": REFS["labels"][0], **state})
    new = {p: out[f"{p}.new"] for p in PARAMS}
    path = tmp_path / "trained.onnx"
    trained = training.trained_model(source, new, path, external_data_threshold=64)
    assert (tmp_path / "trained.onnx.data").exists()
    loaded = ir.load(path)
    x = REFS["x"][1]
    want = np.tanh(x @ new["fc1.weight"] + new["fc1.bias"]) @ new["fc2.weight"] + new["fc2.bias"]
    for m in (trained, loaded):
        np.testing.assert_allclose(run_all(m, {"X": x})["Y"], want, rtol=1e-5, atol=1e-6)
    small = training.trained_model(source, new, tmp_path / "small.onnx")
    assert not (tmp_path / "small.onnx.data").exists() and len(small.graph.initializers) == 5
    np.testing.assert_array_equal(source.graph.initializers["fc1.weight"].const_value.numpy(),
                                  REFS["init/fc1.weight"])  # fmt: skip


def test_trained_model_casts_master_weights_back_to_half() -> None:
    src = mlp(init={k: REFS[f"init/{k}"].astype(np.float16) for k in PARAMS}, dtype=np.float16)
    out = training.trained_model(src, {"fc1.bias": np.ones(5, np.float32)})
    tensor = out.graph.initializers["fc1.bias"].const_value
    assert tensor is not None and tensor.dtype == ir.DataType.FLOAT16
    np.testing.assert_array_equal(tensor.numpy(), np.ones(5, np.float16))


# Diagnostics.


def test_unknown_loss_output() -> None:
    with pytest.raises(
        SelectionError, match=r"no graph output named 'nll'.*\['Y', 'loss'\].*add_loss"
    ):
        training.step(reference_model(), loss="nll")


def test_non_scalar_loss() -> None:
    with pytest.raises(
        SelectionError, match=r"loss output 'Y' is FLOAT of shape \[N, 3\], expected a rank-0"
    ):
        training.step(reference_model(), loss="Y")


def test_frozen_pattern_matching_nothing() -> None:
    with pytest.raises(
        SelectionError,
        match=r"frozen entry 'encoder\.\*' matches no float initializer.*\['fc1\.weight'",
    ):
        training.step(reference_model(), frozen=["fc1.bias", "encoder.*"])


def test_non_float_param() -> None:
    with pytest.raises(
        SelectionError,
        match=r"parameter 'unused_int' is INT64, expected FLOAT16.*leave 'unused_int' out",
    ):
        training.step(reference_model(), params=["fc1.weight", "unused_int"])


def test_param_matching_nothing() -> None:
    with pytest.raises(
        SelectionError, match=r"params entry 'fc3\.\*' matches no initializer.*fc2\.bias"
    ):
        training.step(reference_model(), params="fc3.*")


def test_everything_frozen() -> None:
    with pytest.raises(SelectionError, match=r"no parameter left to train.*frozen="):
        training.step(reference_model(), frozen="fc*")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: training.SGD(nesterov=True), r"nesterov=True needs momentum > 0"),
        (lambda: training.Adam(betas=(0.9, 1.0)), r"betas\[1\]=1.0, expected a value in \[0, 1\)"),
        (lambda: training.AdamW(lr=-1.0), r"AdamW: lr=-1.0, expected a value >= 0"),
    ],
)
def test_bad_hyperparameters(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_optimizer_and_clip() -> None:
    with pytest.raises(TypeError, match=r"optimizer is str, expected onnax.training.SGD"):
        training.step(reference_model(), optimizer="adam")
    with pytest.raises(ValueError, match=r"max_grad_norm=0, expected a positive norm"):
        training.step(reference_model(), max_grad_norm=0)


def test_helpers_refuse_an_inference_model() -> None:
    with pytest.raises(
        SelectionError, match=r"no 'onnax.training' metadata.*pass the training model"
    ):
        training.initial_state(reference_model())
    with pytest.raises(SelectionError, match=r"'fc9.weight' is not an initializer.*Initializers"):
        training.trained_model(reference_model(), {"fc9.weight": np.zeros(3)})
    with pytest.raises(
        SelectionError, match=r"has shape \[5\] in the model, got an array of shape \[4\]"
    ):
        training.trained_model(reference_model(), {"fc1.bias": np.zeros(4)})


def test_inactive_clipping_leaves_the_torch_trajectory() -> None:
    """A norm bound far above the gradients' norm scales them by exactly 1 (the factor is
    clamped), so the clipped step follows torch's unclipped Adam."""
    case = next(c for c in CASES if c["name"] == "adam")
    model = training.step(reference_model(), optimizer=optimizer_of(case), max_grad_norm=1e3)
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    state = training.initial_state(model)
    for s in range(STEPS):
        feeds = {"X": REFS["x"][s], "target": REFS["labels"][s], **state}
        out = dict(zip(names, sess.run(None, feeds), strict=True))
        state = {i: out[o] for i, o in training.carry(model)}
        check_step(case, s, out["loss"], {p: state[p] for p in PARAMS})


def test_deterministic() -> None:
    source = reference_model()
    first = ir.to_proto(training.step(source, optimizer=training.Adam(amsgrad=True)))
    again = ir.to_proto(training.step(source, optimizer=training.Adam(amsgrad=True)))
    assert first.SerializeToString() == again.SerializeToString()


def _conv_bn_model() -> ir.Model:
    """Conv -> BatchNormalization (inference) -> ReduceSum loss, weights as initializers."""
    rng = np.random.default_rng(0)
    x = ir.val("x", ir.DataType.FLOAT, ir.Shape([2, 3, 5, 5]))
    inits = {
        "conv.weight": rng.standard_normal((4, 3, 3, 3)),
        "bn.weight": rng.standard_normal(4),
        "bn.bias": rng.standard_normal(4),
        "bn.running_mean": rng.standard_normal(4),
        "bn.running_var": rng.uniform(0.5, 2.0, 4),
    }
    values = {
        name: ir.Value(name=name, const_value=ir.tensor(a.astype(np.float32)))
        for name, a in inits.items()
    }
    for v in values.values():
        v.type = ir.TensorType(ir.DataType.FLOAT)
        v.shape = ir.Shape(v.const_value.shape)  # type: ignore[union-attr]
    conv = ir.node("Conv", [x, values["conv.weight"]])
    bn = ir.node(
        "BatchNormalization",
        [
            conv.outputs[0],
            *(values[f"bn.{k}"] for k in ("weight", "bias", "running_mean", "running_var")),
        ],
    )
    loss = ir.node("ReduceSum", [bn.outputs[0]], attributes={"keepdims": 0})
    loss.outputs[0].name = "loss"
    loss.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    loss.outputs[0].shape = ir.Shape([])
    graph = ir.Graph(
        [x],
        [loss.outputs[0]],
        nodes=[conv, bn, loss],
        initializers=list(values.values()),
        opset_imports={"": 17},
        name="conv_bn",
    )
    return ir.Model(graph, ir_version=10)


def test_batchnorm_running_statistics_are_not_trained_by_default() -> None:
    model = _conv_bn_model()
    step = training.step(model, optimizer=training.SGD(lr=0.1))
    assert list(training.layout(step)["params"]) == ["conv.weight", "bn.weight", "bn.bias"]
    assert {"bn.running_mean", "bn.running_var"} <= set(step.graph.initializers)
    # named explicitly, they are trained like any parameter
    named = training.step(model, params=["conv.weight", "bn.running_mean"])
    assert list(training.layout(named)["params"]) == ["conv.weight", "bn.running_mean"]
