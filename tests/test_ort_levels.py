"""Derivative models at every onnxruntime optimization level, against float64 references.

The gradient of a ReLU/max-pool net is piecewise smooth: it jumps where a unit's pre-activation
crosses 0 or two taps of a max-pool window swap order. The levels of onnxruntime sum the
convolutions in different orders (folded BatchNorm, fused Conv+Add, NCHWc blocking at
``ORT_ENABLE_ALL``), which moves every activation by float32 rounding (~1e-7 relative to the
layer's scale). A unit whose float64 pre-activation lies within that distance of 0 is then on
either side depending on the level, and so is the gradient. Measured on inception_v1: one unit of
the first layer has the float64 pre-activation 3.0e-7; float32 gives -1.9e-7 at
``ORT_DISABLE_ALL``/``BASIC``/``EXTENDED`` and 1.1e-7 at ``ALL``; that single unit moves the image
gradient by 1.1e-3 (relative, in norm), the whole difference between the levels. On resnet50
(activations up to 6e3, so rounding reaches 1e-3) three to four units flip at every level
(3.9e-3 to 7.3e-3 off the float64 gradient); on densenet121 one unit (3.0e-8 in float64) at
``BASIC``/``EXTENDED`` (5.6e-5).
No emitted comparison is involved: the ReLU mask is read from the stored output, and the
max-pool selection finds a tap equal to the stored output in every window at every level.

So a float64 gradient at the same point is no float32 oracle finer than ~1e-2 (a handful of
flips, each up to ~1e-3). The oracle here pins the pieces instead: the float64 twin of the
model (``zoo.float64_twin``) with every ReLU replaced by ``p * mask`` and every MaxPool by a
gather at given indices, where the masks and the indices are those of the float32 forward pass
that the derivative model itself ran at that level (the ReLU's stored output ``> 0``; the first
maximum of each window of the stored max-pool input, computed in numpy). The pinned twin is a
smooth function, so its float64 gradient is the exact derivative of the piece the float32 model
is on, and central differences in float64 check it without knowing any rule. What remains is
float32 rounding of the derivative model itself (measured below 2e-6), so ``PINNED_RTOL`` of 1e-4
leaves a wide margin and still fails on a unit or window selected wrongly (the flips above
moved the gradient by 5.6e-5 to 1.1e-3 each).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnax
from test_zoo import TOL, prepared

LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
PINNED_RTOL = 1e-4
FD_EPS = 1e-6  # the pinned twin is smooth: no switch can lie inside the step


def session_at(model: ir.Model, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = level
    return ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def run_at(
    model: ir.Model | ort.InferenceSession,
    feeds: Mapping[str, np.ndarray],
    level: ort.GraphOptimizationLevel,
) -> dict[str, np.ndarray]:
    """Runs ``model`` (or a session already made) at ``level``."""
    sess = model if isinstance(model, ort.InferenceSession) else session_at(model, level)
    wanted = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return {o.name: r for o, r in zip(sess.get_outputs(), outs, strict=True)}


def first_maximum(x: np.ndarray, node: ir.Node) -> np.ndarray:
    """MaxPool's selection by numpy: the flat index (in its plane) of each window's first maximum.

    Row-major order in a window is increasing flat index, so ``argmax`` (first occurrence) is
    the element of least index among tied maxima, the one the runtime's ``Indices`` name.
    """
    assert node.attributes.get_int("ceil_mode", 0) == 0
    assert node.attributes.get_string("auto_pad", "NOTSET") == "NOTSET"
    assert list(node.attributes.get_ints("dilations", [1, 1])) == [1, 1]
    kh, kw = node.attributes.get_ints("kernel_shape")
    sh, sw = node.attributes.get_ints("strides", [1, 1])
    top, left, bottom, right = node.attributes.get_ints("pads", [0, 0, 0, 0])
    n, c, _, w = x.shape
    padded = np.pad(x, [(0, 0), (0, 0), (top, bottom), (left, right)], constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw]
    oh, ow = windows.shape[2:4]
    local = np.argmax(windows.reshape(n, c, oh, ow, kh * kw), axis=-1)
    rows = np.arange(oh)[:, None] * sh - top + local // kw
    cols = np.arange(ow)[None, :] * sw - left + local % kw
    return (rows * w + cols).reshape(n, c, oh * ow).astype(np.int64)


class PinnedTwin:
    """The float64 twin with its ReLU masks and max-pool selections as inputs (see module doc)."""

    def __init__(self, name: str) -> None:
        model, feeds, twin = prepared(name)
        self.image = next(iter(feeds))
        self.weights = twin.weights
        pinned = ir.from_proto(ir.to_proto(twin.model))
        graph = pinned.graph
        self.relus: list[str] = []
        self.pools: dict[str, ir.Node] = {}  # MaxPool output name -> the float32 model's node
        self.pool_shapes: dict[str, list[int]] = {}  # and the shape of its input
        float_pools = {str(n.outputs[0].name): n for n in model.graph if n.op_type == "MaxPool"}
        for node in list(graph):
            if node.op_type not in ("Relu", "MaxPool"):
                continue
            x, y = node.inputs[0], node.outputs[0]
            assert x is not None and y.shape is not None
            y_name = str(y.name)
            if node.op_type == "Relu":
                pin = ir.val(f"mask__{y_name}", ir.DataType.DOUBLE, y.shape)
                new = [ir.node("Mul", [x, pin])]
                self.relus.append(y_name)
            else:
                n, c, *plane = [int(d) for d in y.shape.dims]
                pin = ir.val(f"index__{y_name}", ir.DataType.INT64, [n, c, int(np.prod(plane))])
                to_flat = ir.node("Constant", [], {"value": ir.tensor(np.array([0, 0, -1]))})
                flat = ir.node("Reshape", [x, to_flat.outputs[0]])
                picked = ir.node("GatherElements", [flat.outputs[0], pin], {"axis": 2})
                dims = np.array([int(d) for d in y.shape.dims], np.int64)
                to_y = ir.node("Constant", [], {"value": ir.tensor(dims)})
                back = ir.node("Reshape", [picked.outputs[0], to_y.outputs[0]])
                new = [to_flat, flat, picked, to_y, back]
                self.pools[y_name] = float_pools[y_name]
                assert x.shape is not None
                self.pool_shapes[y_name] = [int(d) for d in x.shape.dims]
            graph.inputs.append(pin)
            graph.insert_before(node, new)
            out = new[-1].outputs[0]
            out.type, out.shape = y.type, y.shape
            y.replace_all_uses_with(out, replace_graph_outputs=True)
            y.name = None
            out.name = y_name
            graph.remove(node, safe=True)
        # Sessions of the twin take seconds to make (a Conv is dozens of Einsums): made once.
        self.model = session_at(pinned, LEVELS["disable_all"])
        grad_model = onnax.grad(pinned, [self.image], output="loss")
        self.grad_model = session_at(grad_model, LEVELS["disable_all"])

    def stored(self, derived: ir.Model) -> dict[str, str]:
        """For each pin, the name of the float32 value of ``derived`` it is read from.

        ReLU outputs keep their names; a max-pool input may not (prepare expands LRN, whose
        output then has a generated name), so it is found through ``derived``'s own MaxPool.
        """
        names = {f"mask__{r}": r for r in self.relus}
        inputs = {
            str(n.outputs[0].name): str(n.inputs[0].name)
            for n in derived.graph
            if n.op_type == "MaxPool" and n.inputs[0] is not None
        }
        names.update({f"index__{y}": inputs[y] for y in self.pools})
        return names

    def pins(
        self, forward: Mapping[str, np.ndarray], stored: Mapping[str, str]
    ) -> dict[str, np.ndarray]:
        """Masks and indices from a float32 forward pass (``stored``: see :meth:`stored`)."""
        pins = {
            k: (forward[stored[k]] > 0).astype(np.float64) for k in stored if k.startswith("mask__")
        }
        for y, node in self.pools.items():
            key = f"index__{y}"
            pins[key] = first_maximum(forward[stored[key]], node)
        return pins

    def grad(self, image: np.ndarray, pins: Mapping[str, np.ndarray]) -> np.ndarray:
        feeds = {**self.weights, **pins, self.image: image.astype(np.float64)}
        return run_at(self.grad_model, feeds, LEVELS["disable_all"])[f"grad_{self.image}"]

    def loss_difference(
        self, image: np.ndarray, pins: Mapping[str, np.ndarray], v: np.ndarray
    ) -> float:
        base = {**self.weights, **pins}
        x = image.astype(np.float64)
        at = [
            run_at(self.model, {**base, self.image: x + s * FD_EPS * v}, LEVELS["disable_all"])
            for s in (1.0, -1.0)
        ]
        return float((at[0]["loss"] - at[1]["loss"]) / (2 * FD_EPS))


@functools.lru_cache(maxsize=1)
def pinned_twin(name: str) -> PinnedTwin:
    return PinnedTwin(name)


def relative(got: np.ndarray, want: np.ndarray) -> float:
    want = np.asarray(want, np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def with_outputs(model: ir.Model, names: list[str]) -> ir.Model:
    """``model`` with the values ``names`` as extra graph outputs (a copy)."""
    copy = ir.from_proto(ir.to_proto(model))
    values = {str(o.name): o for n in copy.graph for o in n.outputs}
    for name in names:
        copy.graph.outputs.append(values[name])
    return copy


def references(
    twin: PinnedTwin, image: np.ndarray, pins_by_level: Mapping[str, dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The pinned twin's gradient for each level; levels on the same pieces share one run."""
    done: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
    out = {}
    for level, pins in pins_by_level.items():
        for seen, grad in done:
            if all(np.array_equal(seen[k], pins[k]) for k in pins):
                out[level] = grad
                break
        else:
            out[level] = twin.grad(image, pins)
            done.append((pins, out[level]))
    return out


def check_reference(twin: PinnedTwin, image: np.ndarray, pins: Mapping[str, np.ndarray]) -> None:
    """The pinned twin's reverse-mode gradient against its own central differences."""
    v = np.random.default_rng(1).standard_normal(image.shape)
    want = twin.loss_difference(image, pins, v)
    got = float(np.sum(twin.grad(image, pins) * v))
    # Smooth in float64: truncation O(eps^2), rounding ~1e-16 / eps (measured 1e-10 to 2e-8).
    assert abs(got - want) <= 1e-6 * abs(want), (got, want)


def check_grad_at_every_level(name: str) -> None:
    model, feeds, _ = prepared(name)
    twin = pinned_twin(name)
    image = twin.image
    derived = onnax.grad(model, [image], output="loss")
    stored = twin.stored(derived)
    probe = with_outputs(derived, sorted(set(stored.values())))
    grads, pins = {}, {}
    for level, value in LEVELS.items():
        out = run_at(probe, feeds, value)
        grads[level], pins[level] = out[f"grad_{image}"], twin.pins(out, stored)
    check_reference(twin, feeds[image], pins["disable_all"])
    refs = references(twin, feeds[image], pins)
    errors = {level: relative(grads[level], refs[level]) for level in LEVELS}
    assert max(errors.values()) <= PINNED_RTOL, (name, errors)
    # Between levels, only the pieces differ: a few units, each well inside the float32 tolerance.
    base = grads["disable_all"]
    for level in LEVELS:
        assert relative(grads[level], base) <= TOL["rtol"], (name, level)


def batched_pins(
    twin: PinnedTwin, derived: ir.Model, forward: Mapping[str, np.ndarray], examples: int
) -> list[dict[str, np.ndarray]]:
    """Per-example pins from a vmap'd derivative model's forward pass.

    vmap renames values, so the stored ones are found by position: its ReLU and MaxPool nodes
    are the batched forward's, one per node of the twin in the same order (the rules of the
    backward sweep emit neither), ReLU outputs batched at axis 0 and max-pool inputs with the
    batch folded into ``N``.
    """
    relus = [n for n in derived.graph if n.op_type == "Relu"]
    pools = [n for n in derived.graph if n.op_type == "MaxPool"]
    assert len(relus) == len(twin.relus) and len(pools) == len(twin.pools)
    pins: list[dict[str, np.ndarray]] = [{} for _ in range(examples)]
    for name, node in zip(twin.relus, relus, strict=True):
        y = forward[str(node.outputs[0].name)]
        assert y.shape[0] == examples, (name, y.shape)
        for b in range(examples):
            pins[b][f"mask__{name}"] = (y[b] > 0).astype(np.float64)
    for (name, original), node in zip(twin.pools.items(), pools, strict=True):
        x = forward[str(node.inputs[0].name)]
        shape = twin.pool_shapes[name]
        assert x.shape == (examples * shape[0], *shape[1:]), (name, x.shape)
        for b, example in enumerate(x.reshape(examples, *shape)):
            pins[b][f"index__{name}"] = first_maximum(example, original)
    return pins


def check_vmap_of_grad_at_every_level(name: str) -> None:
    """Per-example gradients (two examples, as in test_zoo) against their pinned references."""
    model, feeds, _ = prepared(name)
    twin = pinned_twin(name)
    image = twin.image
    derived = onnax.vmap(onnax.grad(model, [image], output="loss"), in_axes=0)
    stored = [
        n.outputs[0] if n.op_type == "Relu" else n.inputs[0]
        for n in derived.graph
        if n.op_type in ("Relu", "MaxPool")
    ]
    probe = with_outputs(derived, [str(v.name) for v in stored if v is not None])
    x = feeds[image]
    noise = np.random.default_rng(5).standard_normal(x.shape)
    examples = [x, (x + 0.1 * noise).astype(np.float32)]
    grads, pins = {}, {}
    for level, value in LEVELS.items():
        out = run_at(probe, {image: np.stack(examples)}, value)
        grads[level] = out[f"grad_{image}"]
        pins[level] = batched_pins(twin, probe, out, len(examples))
    for b, example in enumerate(examples):
        refs = references(twin, example, {level: pins[level][b] for level in LEVELS})
        errors = {level: relative(grads[level][b], refs[level]) for level in LEVELS}
        assert max(errors.values()) <= PINNED_RTOL, (name, b, errors)


# squeezenet is invariant across the levels and inception_v1 changes pieces between them (one
# unit, see the module doc). resnet50 (three to four units flip at every level) and densenet121
# take 1.5-2x as long as those two together (the float64 twin's convolutions are Einsums), too
# long for the default run: tests/benchmarks/zoo_levels.py checks them (both pass).
MODELS = ("squeezenet", "inception_v1")
MORE_MODELS = ("resnet50", "densenet121")


@pytest.mark.parametrize("name", MODELS)
def test_zoo_derivatives_at_every_level(name: str) -> None:
    check_grad_at_every_level(name)
    check_vmap_of_grad_at_every_level(name)


# ------------------------------------------------------------- a small net, every level
SMALL = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 2, 6, 7] x) => (float loss) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    n = BatchNormalization (c, scale, shift, mean, var)
    a = Relu (n)
    p = MaxPool <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (a)
    q = Mul (p, r)
    loss = ReduceSum <keepdims = 0> (q)
}"""


def small_net() -> tuple[ir.Model, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Conv -> BatchNormalization -> Relu -> MaxPool with exact ties between window maxima.

    onnxruntime folds the BatchNorm into the Conv from ``BASIC`` and computes it in a blocked
    layout at ``ALL``, so the stored values the rules read are rounded differently at each
    level. The image repeats along the width, so interior windows hold equal maxima and the
    selection decides which receptive field gets the cotangent (a rule picking the last of tied
    maxima fails here); about half the units are cut by the ReLU.
    """
    rng = np.random.default_rng(3)
    column = rng.standard_normal((1, 2, 6, 1))
    x = np.repeat(column, 7, axis=3).astype(np.float32)
    x[..., 0] += 0.5  # the border column differs, so ties are interior ones
    weights = {
        "w": rng.standard_normal((4, 2, 3, 3)),
        "b": 0.1 * rng.standard_normal(4),
        "scale": rng.uniform(0.8, 1.2, 4),
        "shift": 0.1 * rng.standard_normal(4),
        "mean": 0.1 * rng.standard_normal(4),
        "var": rng.uniform(0.5, 1.5, 4),
        "r": rng.uniform(-1.0, 1.0, (1, 4, 6, 7)),
    }
    model = ir.from_onnx_text(SMALL)
    # The weights are named in the text and given here (the text would spell out every value).
    values = {str(v.name): v for n in model.graph for v in n.inputs if v is not None}
    for k, v in weights.items():
        value = values[k]
        value.const_value = ir.tensor(v.astype(np.float32), name=k)
        value.dtype, value.shape = ir.DataType.FLOAT, ir.Shape(v.shape)
        model.graph.register_initializer(value)
    return model, {"x": x}, {k: v.astype(np.float32).astype(np.float64) for k, v in weights.items()}


def small_net_gradient(
    model: ir.Model, weights: Mapping[str, np.ndarray], relu_out: np.ndarray
) -> np.ndarray:
    """The gradient w.r.t. ``x`` by numpy in float64, on the pieces of a float32 run."""
    pool = next(n for n in model.graph if n.op_type == "MaxPool")
    index = first_maximum(relu_out, pool)  # [1, C, 42]
    ct = np.zeros((1, 4, 42))
    np.add.at(ct, (0, np.arange(4)[:, None], index[0]), weights["r"].reshape(1, 4, 42)[0])
    ct = ct.reshape(1, 4, 6, 7) * (relu_out > 0)
    ct = ct * (weights["scale"] / np.sqrt(weights["var"] + 1e-5))[None, :, None, None]
    grad = np.zeros((1, 2, 8, 9))  # the padded image
    for i in range(3):
        for j in range(3):
            grad[:, :, i : i + 6, j : j + 7] += np.einsum(
                "nohw,oc->nchw", ct, weights["w"][:, :, i, j]
            )
    return grad[:, :, 1:-1, 1:-1]


def test_small_net_at_every_level_follows_its_own_pieces() -> None:
    model, feeds, weights = small_net()
    derived = onnax.grad(model, ["x"], output="loss")
    probe = with_outputs(derived, ["a"])
    for level, value in LEVELS.items():
        out = run_at(probe, feeds, value)
        assert np.count_nonzero(out["a"] == 0) > 0, "no ReLU kink to test"
        want = small_net_gradient(model, weights, out["a"].astype(np.float64))
        assert relative(out["grad_x"], want) <= PINNED_RTOL, level
