"""Measured coverage of onnax.jvp, vjp and vmap on the ONNX backend node-test corpus.

Usage::

    uv run python tests/benchmarks/coverage.py [--filter SUBSTR] [--limit N] [--jobs 2]
        [--timeout 60] [--transforms jvp,vjp,vmap] [--json results.json] [--verbose]

**Scope.** A case of ``onnx.backend.test.case.node.collect_testcases(None)`` is *in scope* when
its model has a floating-point graph input (FLOAT16, BFLOAT16, FLOAT or DOUBLE, the element
types onnax differentiates: :data:`onnax.core.selection.FLOAT_TYPES`; not an initializer), its test data
holds that input, and onnxruntime runs the model on ``data_sets[0]``. Every in-scope case is
transformed by jvp, vjp (default selection: every FLOAT/DOUBLE input, every FLOAT/DOUBLE output,
so the derivative is taken with respect to every floating-point input) and vmap. Each in-scope
transform gets exactly one status, and the percentage is ``pass / in scope``:

* ``pass``: the generated model passes ``onnx.checker`` (full check), loads and runs in
  onnxruntime, reproduces the primal outputs, and its derivative agrees with the oracles (vmap:
  its outputs equal the stacked outputs of single-example runs). A model without float outputs
  has nothing to differentiate: its jvp and vjp are still checked for validity (and the vjp's
  cotangents must be zero).
* ``refused``: onnax raised an :class:`onnax.OnnaxError` subclass whose message is a proper
  diagnostic: it names an operator (``domain::Op``, :func:`refusal_problem`) and gives the
  reason and a remedy. A refusal that does not is ``failed`` (detail ``badly worded refusal``).
  The report groups refusals by operator and says, from the operator's schema
  (``differentiation_category``), whether the input the derivative reaches it through is marked
  non-differentiable (then refusing is the documented answer) or differentiable/unknown (then a
  rule is missing or a case is unsupported).
* ``failed``: wrong numbers, an invalid generated model, one onnxruntime cannot load or run, a
  badly worded refusal, or an in-scope primal that is not deterministic (no oracle applies).
* ``crashed``: any other exception inside onnax, a dead worker, or the per-case timeout.

Cases outside the scope (``skipped``, with the reason) are counted separately: no FLOAT/DOUBLE
graph input (integer, bool, string, float8 models) or onnxruntime cannot run the primal (nearly
every BFLOAT16 model: its CPU provider has almost no BFLOAT16 kernel). A half model's oracle is
its DOUBLE conversion, else its FLOAT version (``widen_half``; differences in a half type would
measure its rounding), with :data:`HALF_RTOL` for the half arithmetic of the model under test. vmap is still checked on the cases without
a float input that onnxruntime runs (a regression check of the batch rules); those counts are
printed on their own line and are not part of the percentage.

Oracles (they know nothing of the rules):

* **Finite differences.** When the model converts to double (float tensor types, initializers,
  ``Constant``/``ConstantOfShape`` tensors, ``to``/``dtype`` attributes, recursively through
  subgraphs and functions: :func:`to_double`), onnxruntime has double kernels for all of it, and
  the double model reproduces the float32 outputs, central differences are taken in float64 with
  ``eps = 1e-6`` (error ~1e-10), and a model computing in float32 anywhere is held to
  ``rtol = 1e-3, atol = 1e-5 + 1e-6·max|f|`` (float32 rounding of its own derivative computation,
  which scales with the primal magnitudes ``f``); a pure double model to ``rtol = 1e-6``.
  Otherwise (Acos, Tan, Elu... have float kernels only) they are taken in float32 with
  ``eps = 1e-3``: truncation O(eps²)·|f'''| ≈ 1e-6·|f'''|, rounding ~6e-8·|f|/eps ≈ 6e-5·|f|,
  hence ``rtol = 3e-2, atol = 3e-3 + 3e-4·max|f|``. Errors are element-wise:
  ``|got - fd| <= atol + rtol·(|fd| + 0.1·max|fd|)``. When an output changes shape between the
  two sides (OneHot depth, Range limit at an integer), or one side leaves the operator's domain
  (onnxruntime rejects Upsample's ``scales`` below 1), one-sided differences are used. The
  double conversion also sets GroupNormalization's ``stash_type`` to DOUBLE (its default FLOAT
  makes onnxruntime normalise in float32 even for double data, and float32 rounding over
  ``eps = 1e-6`` is noise), and a double model whose outputs are float32 numbers at inputs
  moved off the float32 grid (a double kernel computing in float32, like onnxruntime's Shrink)
  is not trusted: the float32 differences are used.
* **jvp**: its tangent outputs against the differences along a random direction ``v``.
* **vjp**: (1) the adjoint identity ``<u, J v> = <Jᵀ u, v>`` against the independently built jvp
  model, if that passed, along the random ``v`` and along ``v = Jᵀu`` (there ``<u, J Jᵀu>`` cannot
  cancel, so an error along ``Jᵀu``, a wrong scale say, shows); tolerance ``1e-4`` (float32) of
  ``||u||·||Jv|| + ||v||·||Jᵀu||``; (2) element by element, ``(Jᵀu)_i = <u, J e_i>`` with
  ``J e_i`` by finite differences for up to :data:`MAX_ELEMENTS` input elements (independent of
  the jvp); (3) the adjoint identity against the differences along ``v``.

* **The primal's runtime.** The oracles run the primal in onnxruntime, except where its kernel
  writes finite numbers at entries the case's expected outputs hold as infinite (and agrees
  elsewhere) while the ONNX reference evaluator reproduces the expected outputs: there the
  oracles run ``onnx.reference`` (the two ``attention_*_qk_matmul_bias_*_mask_causal`` cases,
  where onnxruntime's fused Attention writes the lowest float instead of the specified -inf;
  the detail says ``through onnx.reference``). Generated models always run in onnxruntime.

Test data holding NaN/inf: directions and seeds are zero there, entries where the primal output
is not finite are excluded, and non-finite terms are dropped from the sums. Finite differences
are unreliable at non-differentiable points (Relu/Abs at 0, ties of Max/Min, Floor at integers,
OneHot's float depth and indices) and the corpus is full of such inputs (integer-valued floats,
repeated values, zeros). So when the numbers disagree at ``data_sets[0]``, the check is repeated
at perturbed points (:data:`PERTURBATIONS`: relative noise, additive noise, a small upward shift;
seeded; a point that changes an output's shape is skipped), and the transform passes if it
agrees at one of them, with ``perturbed (<kind>)`` in the detail. A rule that is wrong
everywhere fails at every point; the failure detail is the reason at ``data_sets[0]``.

vmap (oracle: a loop of single-example runs of the primal in onnxruntime, stacked along axis 0).
A batch holds :data:`VMAP_BATCH` = 3 examples: ``data_sets[0]`` and two copies whose
floating-point inputs get seeded 5 % noise (integer, bool and string inputs are identical
copies; so is a whole example whose perturbation changes an output's shape or makes
onnxruntime fail, noted in the detail). Two variants are built and run:

* ``in_axes=0``: every graph input batched at axis 0;
* ``in_axes={x: 0}``: only the first FLOAT/DOUBLE input ``x`` batched, the others shared (left
  out when the case has no float input or no other input).

Outputs must have the same dtype and shape as the stacked loop outputs; integer, bool and string
outputs must be equal, NaN and infinities must be where the loop has them, and finite float
values agree to :data:`VMAP_RTOL` (1e-5 for float32, 1e-10 for double) of ``|loop| + the
example's max |loop|``. The case's status is the worse of the two variants, except that a
refusal of one variant next to a pass of the other is a pass noting the refusal: batching every
input also batches integer inputs that act as attributes (Reduce*'s axes, Reshape's shape),
which vmap rightly refuses, and the float variant then shows whether the batch rules work.
A failed or crashed variant always decides; the detail of a non-pass starts with the variant.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
import onnxruntime as ort

import onnax
from onnax.core.widen import widen_half

__all__ = [
    "SCOPE",
    "STATUSES",
    "TRANSFORMS",
    "check_case",
    "collect_cases",
    "in_scope",
    "refusal_problem",
    "refused_operator",
    "run_corpus",
    "schema_category",
    "summarize",
    "to_double",
]

TRANSFORMS = ("jvp", "vjp", "vmap")
STATUSES = ("pass", "refused", "failed", "crashed", "skipped")
"""``skipped`` is for cases outside the scope only; an in-scope case is never skipped."""

SCOPE = "scope"
"""The key of a result that says whether the case is in scope: ``("in", "")`` or ``("out", why)``."""

FLOAT = onnx.TensorProto.FLOAT
DOUBLE = onnx.TensorProto.DOUBLE
FLOAT16 = onnx.TensorProto.FLOAT16
BFLOAT16 = onnx.TensorProto.BFLOAT16
FLOAT_TYPES = (FLOAT, DOUBLE, FLOAT16, BFLOAT16)
TO_DOUBLE = (FLOAT, FLOAT16, BFLOAT16)
"""The element types :func:`to_double` widens (the half types too: their oracle is float64)."""
HALF_RTOL = 16 * 2.0**-10
"""FLOAT16 derivatives: a path of up to 8 rounded operators x a condition factor up to 4 x the
unit roundoff eps/2 (eps = 2^-10), as in tests/test_half_precision.py."""

Feeds = dict[str, Any]
Result = dict[str, tuple[str, str]]


# --------------------------------------------------------------------------------------------
# onnxruntime helpers


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    """A single-threaded CPU session (the driver runs cases in parallel processes)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@dataclasses.dataclass(frozen=True)
class _Arg:
    name: str


class _ReferenceSession:
    """``onnx.reference.ReferenceEvaluator`` behind the part of the session interface the driver
    uses for the *primal* (the oracles' runs); generated models always run in onnxruntime.

    Used only for a case whose onnxruntime kernel does not reproduce the case's expected
    outputs while the reference evaluator does (:func:`_primal_runtime`): there onnxruntime's
    numbers are not the operator's, so neither its finite differences nor its single-example
    runs can judge a model that computes the operator as specified. (The two
    ``attention_*_qk_matmul_bias_*_mask_causal`` cases: onnxruntime's fused Attention writes
    the lowest finite float into ``qk_matmul_output`` where the specification writes -inf.)
    """

    def __init__(self, proto: onnx.ModelProto) -> None:
        from onnx.reference import ReferenceEvaluator

        self._evaluator = ReferenceEvaluator(proto)
        self._inputs = [_Arg(n) for n in self._evaluator.input_names]
        self._outputs = [_Arg(n) for n in self._evaluator.output_names]

    def get_inputs(self) -> list[_Arg]:
        return self._inputs

    def get_outputs(self) -> list[_Arg]:
        return self._outputs

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[Any]:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return list(self._evaluator.run(names, dict(feeds)))


Runtime = Callable[[onnx.ModelProto], Any]
"""Builds the session that runs a primal (or its double twin) for the oracles."""


def _primal_runtime(
    testcase: Any, proto: onnx.ModelProto, feeds: Feeds, first: Mapping[str, Any]
) -> Runtime:
    """onnxruntime, unless at ``data_sets[0]`` its outputs are finite where the case's expected
    outputs are infinite (agreeing elsewhere) and the ONNX reference evaluator's outputs agree
    with the expected ones: then :class:`_ReferenceSession`.

    Only that pattern switches: where onnxruntime merely computes different numbers (Resize
    with ``align_corners`` on downsampling, MaxUnpool with an output shape, a seeded training
    Dropout), a generated model reproduces them with the same kernel and onnxruntime stays the
    judge.
    """
    if not testcase.data_sets or not testcase.data_sets[0][1]:
        return _session
    names = [o.name for o in proto.graph.output]
    expected = {n: _to_feed(v) for n, v in zip(names, testcase.data_sets[0][1], strict=False)}
    if not _finite_where_infinite(expected, first):
        return _session
    try:
        reference = _run(_ReferenceSession(proto), feeds)
    except Exception:
        return _session
    if _outputs_agree(expected, {k: reference[k] for k in expected if k in reference}, 1e-3, 1e-4):
        return _ReferenceSession
    return _session


def _finite_where_infinite(expected: Mapping[str, Any], got: Mapping[str, Any]) -> bool:
    """Whether ``got`` is finite at some infinite entry of ``expected`` and agrees elsewhere."""
    found = False
    for k, want in expected.items():
        have = got.get(k)
        if not isinstance(want, np.ndarray) or not isinstance(have, np.ndarray):
            continue
        if want.shape != have.shape or want.dtype.kind != "f":
            return False
        inf = np.isinf(want)
        if (inf & ~np.isfinite(have)).any() and not np.array_equal(want[inf], have[inf]):
            return False
        found = found or bool((inf & np.isfinite(have)).any())
        rest = {k: np.where(inf, 0.0, want)}, {k: np.where(inf, 0.0, have)}
        if not _outputs_agree(*rest, rtol=1e-3, atol=1e-4):
            return False
    return found


def _run(sess: ort.InferenceSession, feeds: Mapping[str, Any]) -> dict[str, Any]:
    wanted = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return {o.name: r for o, r in zip(sess.get_outputs(), outs, strict=True)}


def _to_feed(value: Any) -> Any:
    """Test data as onnxruntime takes it: numpy arrays (not protos or numpy scalars), lists."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, onnx.SequenceProto):
        return [_to_feed(v) for v in onnx.numpy_helper.to_list(value)]
    if isinstance(value, onnx.OptionalProto):
        return _to_feed(onnx.numpy_helper.to_optional(value))
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, list):
        return [_to_feed(v) for v in value]
    return value


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {line}"[:300]


# --------------------------------------------------------------------------------------------
# float -> double conversion of a model (for float64 finite differences)

_DTYPE_ATTRS = frozenset({"to", "dtype", "output_dtype"})


def _convert_type(tp: onnx.TypeProto) -> None:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        if tp.tensor_type.elem_type in TO_DOUBLE:
            tp.tensor_type.elem_type = DOUBLE
    elif which == "sparse_tensor_type":
        if tp.sparse_tensor_type.elem_type in TO_DOUBLE:
            tp.sparse_tensor_type.elem_type = DOUBLE
    elif which == "sequence_type":
        _convert_type(tp.sequence_type.elem_type)
    elif which == "optional_type":
        _convert_type(tp.optional_type.elem_type)
    elif which == "map_type":
        _convert_type(tp.map_type.value_type)


def _convert_tensor(t: onnx.TensorProto) -> None:
    if t.data_type not in TO_DOUBLE:
        return
    array = onnx.numpy_helper.to_array(t).astype(np.float64)
    t.CopyFrom(onnx.numpy_helper.from_array(array, t.name))


def _convert_attribute(node: onnx.NodeProto, attr: onnx.AttributeProto) -> None:
    A = onnx.AttributeProto
    if attr.type == A.TENSOR:
        _convert_tensor(attr.t)
    elif attr.type == A.TENSORS:
        for t in attr.tensors:
            _convert_tensor(t)
    elif attr.type == A.GRAPH:
        _convert_graph(attr.g)
    elif attr.type == A.GRAPHS:
        for g in attr.graphs:
            _convert_graph(g)
    elif attr.type == A.TYPE_PROTO:
        _convert_type(attr.tp)
    elif attr.type == A.INT and attr.name in _DTYPE_ATTRS and attr.i in TO_DOUBLE:
        attr.i = DOUBLE


def _convert_node(node: onnx.NodeProto) -> None:
    if node.op_type == "GroupNormalization" and node.domain in ("", "ai.onnx"):
        # stash_type (opset 21, default FLOAT) is the precision of the normalisation itself:
        # onnxruntime honours it for double data, which would make the differences float32 noise.
        for attr in list(node.attribute):
            if attr.name == "stash_type":
                node.attribute.remove(attr)
        node.attribute.append(onnx.helper.make_attribute("stash_type", DOUBLE))
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        # value_float(s) can only hold float32: re-express them as a double tensor.
        for attr in list(node.attribute):
            if attr.name in ("value_float", "value_floats"):
                data = np.asarray(
                    attr.f if attr.name == "value_float" else list(attr.floats), np.float64
                )
                node.attribute.remove(attr)
                node.attribute.append(
                    onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(data))
                )
    for attr in node.attribute:
        _convert_attribute(node, attr)


def _convert_graph(graph: onnx.GraphProto) -> None:
    for v in (*graph.input, *graph.output, *graph.value_info):
        _convert_type(v.type)
    for t in graph.initializer:
        _convert_tensor(t)
    for st in graph.sparse_initializer:
        _convert_tensor(st.values)
    for node in graph.node:
        _convert_node(node)


def to_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every FLOAT tensor, type and dtype attribute turned into DOUBLE.

    Converts graph inputs/outputs/value_info (through sequence/optional/map types), initializers
    (dense and sparse), tensor attributes (``Constant``, ``ConstantOfShape``...), ``value_float``
    and ``value_floats`` of ``Constant`` (re-expressed as a double ``value``), INT attributes
    named ``to``/``dtype``/``output_dtype`` equal to FLOAT (``Cast``, ``RandomNormal``,
    ``EyeLike``...), type-proto attributes, subgraphs and model-local functions. Float scalar
    attributes (``alpha``...) stay as they are: attributes have no element type.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _convert_graph(copy.graph)
    for fn in copy.functions:
        for v in fn.value_info:
            _convert_type(v.type)
        for node in fn.node:
            _convert_node(node)
    return copy


# --------------------------------------------------------------------------------------------
# the finite-difference oracle


def _is_float_array(a: Any) -> bool:
    return isinstance(a, np.ndarray) and (
        a.dtype in (np.float32, np.float64, np.float16) or a.dtype.name == "bfloat16"
    )


def _is_half(a: Any) -> bool:
    return isinstance(a, np.ndarray) and (a.dtype == np.float16 or a.dtype.name == "bfloat16")


def _outputs_agree(a: Mapping[str, Any], b: Mapping[str, Any], rtol: float, atol: float) -> bool:
    """Same output names, shapes and (for float outputs) values up to a norm-scaled tolerance."""
    if set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
            continue  # sequences/optionals: not compared
        if x.shape != y.shape:
            return False
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            finite = np.isfinite(x64) & np.isfinite(y64)
            if not np.array_equal(np.isfinite(x64), np.isfinite(y64)):
                return False
            if not finite.any():
                continue
            scale = float(np.max(np.abs(x64[finite])))
            if np.max(np.abs(x64[finite] - y64[finite])) > atol + rtol * max(scale, 1.0):
                return False
        elif x.dtype != object and not np.array_equal(x, y):
            return False
    return True


class _ShapeChange(ValueError):
    """An output's shape differs between the two sides of a central difference."""


@dataclasses.dataclass
class Oracle:
    """Central differences of the primal, in float64 when the model converts to double.

    Attributes:
        sess: Session of the model the differences are taken on.
        double: Whether that model is the double conversion.
        float32: Whether the model under test computes in float32 anywhere (then its
            derivatives carry float32 rounding even when the selected values are double).
        half: Whether it computes in FLOAT16/BFLOAT16 (its inputs or outputs are half).
    """

    sess: ort.InferenceSession
    double: bool
    float32: bool = True
    half: bool = False

    @property
    def eps(self) -> float:
        return 1e-6 if self.double else 1e-3

    def tolerance(self, fmax: float) -> tuple[float, float]:
        """(rtol, atol) for a derivative computed by the model under test against these differences.

        ``fmax`` bounds the magnitude of the values whose rounding pollutes the comparison
        (the primal outputs): float32 arithmetic is exact to ~1e-7 of them, not of the result.
        """
        if not self.double:
            return 3e-2, 3e-3 + 3e-4 * fmax
        if self.half:
            return HALF_RTOL, 1e-3 + 1e-3 * fmax
        if not self.float32:
            return 1e-6, 1e-9 + 1e-9 * fmax
        return 1e-3, 1e-5 + 1e-6 * fmax

    def base(self, feeds: Feeds) -> Feeds:
        """The feeds as the oracle's model takes them (float inputs cast to double)."""
        if not self.double and self.half:  # the FLOAT version of a half model
            return {k: v.astype(np.float32) if _is_half(v) else v for k, v in feeds.items()}
        if not self.double:
            return dict(feeds)
        return {k: v.astype(np.float64) if _is_float_array(v) else v for k, v in feeds.items()}

    def _central(
        self, f: Callable[[float], dict[str, Any]], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """``(f(eps) - f(-eps)) / 2 eps``; one-sided differences when an output changes shape
        between the two sides (a size that depends on a float input at an integer: OneHot's
        depth, Range's limit; the dependence is then piecewise constant and one side exact) or
        when onnxruntime rejects one side (a step out of the operator's domain, e.g. Upsample's
        ``scales`` below 1 at a scale of exactly 1)."""
        h = self.eps
        sides: dict[float, dict[str, Any] | None] = {}

        def side(step: float) -> dict[str, Any] | None:
            if step not in sides:
                try:
                    sides[step] = f(step)
                except Exception:
                    if step == 0.0:
                        raise
                    sides[step] = None
            return sides[step]

        plus, minus = side(h), side(-h)
        if plus is not None and minus is not None:
            with contextlib.suppress(_ShapeChange):
                return self._difference(plus, minus, outputs, 2 * h)
        zero = side(0.0)
        assert zero is not None
        if plus is not None:
            with contextlib.suppress(_ShapeChange):
                return self._difference(plus, zero, outputs, h)
        if minus is not None:
            return self._difference(zero, minus, outputs, h)
        raise _ShapeChange("onnxruntime rejects the model on both sides of the point")

    def _difference(
        self, plus: Mapping[str, Any], minus: Mapping[str, Any], outputs: Sequence[str], step: float
    ) -> dict[str, np.ndarray]:
        result = {}
        for y in outputs:
            p, m = np.asarray(plus[y]), np.asarray(minus[y])
            if p.shape != m.shape:
                raise _ShapeChange(
                    f"output {y!r} changes shape under perturbation: {p.shape} vs {m.shape}"
                )
            result[y] = (p.astype(np.float64) - m.astype(np.float64)) / step
        return result

    def fd(
        self, base: Feeds, direction: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """``(f(x + eps v) - f(x - eps v)) / 2 eps`` for the named outputs."""

        def f(step: float) -> dict[str, Any]:
            shifted = dict(base)
            for n, d in direction.items():
                x = base[n]
                shifted[n] = np.asarray(x.astype(np.float64) + step * d.astype(np.float64)).astype(
                    x.dtype
                )
            return _run(self.sess, shifted)

        try:
            return self._central(f, outputs)
        except _ShapeChange:
            # Both sides of the direction leave the domain (Upsample's scales at exactly 1 move
            # below 1 along some components on either side): J v = sum_i v_i J e_i, each column
            # by (one-sided where needed) differences along one basis vector.
            size = sum(int(np.size(d)) for d in direction.values())
            if size > MAX_COLUMNS:
                raise
            total = {y: np.zeros(np.shape(_run(self.sess, base)[y])) for y in outputs}
            for n, d in direction.items():
                for i in np.flatnonzero(d):
                    col = self.fd_element(base, n, int(i), outputs)
                    for y in outputs:
                        total[y] = total[y] + float(d.flat[i]) * col[y]
            return total

    def fd_element(
        self, base: Feeds, name: str, index: int, outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Finite differences along one basis vector: the derivative w.r.t. ``name.flat[index]``."""

        def f(step: float) -> dict[str, Any]:
            x = np.array(base[name], copy=True)
            x.flat[index] = x.dtype.type(float(x.flat[index]) + step)
            return _run(self.sess, {**base, name: x})

        return self._central(f, outputs)

    def frozen(self, base: Feeds, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Per input, the elements onnxruntime rejects any step of (on both sides).

        Such an element's value is pinned by the kernel (the batch and channel scales of a
        4-D linear Resize must be exactly 1): no derivative along it is observable, so the
        checks leave it out. Probed only for inputs of at most :data:`MAX_COLUMNS` elements.
        """
        h = self.eps
        result = {}
        for n in names:
            mask = np.zeros(np.shape(base[n]), bool)
            if mask.size <= MAX_COLUMNS:
                for i in range(mask.size):
                    rejected = 0
                    for step in (h, -h):
                        x = np.array(base[n], copy=True)
                        x.flat[i] = x.dtype.type(float(x.flat[i]) + step)
                        try:
                            _run(self.sess, {**base, n: x})
                        except Exception:
                            rejected += 1
                    mask.flat[i] = rejected == 2
            result[n] = mask
        return result


def _make_oracle(
    proto: onnx.ModelProto, feeds: Feeds, primal: Mapping[str, Any], runtime: Runtime = _session
) -> Oracle:
    """The float64 oracle when the double conversion loads, reproduces the primal outputs and
    really computes in double (:func:`_rounds_to_float32`); else the float32 oracle."""
    converted = to_double(proto)
    float32 = converted != proto  # the model mentions FLOAT somewhere
    half = any(_is_half(v) for v in (*feeds.values(), *primal.values()))
    with contextlib.suppress(Exception):
        sess = runtime(converted)
        oracle = Oracle(sess, True, float32, half)
        out = _run(sess, oracle.base(feeds))
        agree = (HALF_RTOL, 1e-3) if half else (1e-3, 1e-4)  # the half model rounds
        if _outputs_agree(primal, out, *agree) and not _rounds_to_float32(sess, oracle.base(feeds)):
            return oracle
    if half:
        # Differences in a half type measure its rounding: take them on the FLOAT version.
        widened = ir.to_proto(widen_half(ir.from_proto(proto)))
        return Oracle(runtime(widened), False, True, half)
    return Oracle(runtime(proto), False, float32, half)


def _rounds_to_float32(sess: ort.InferenceSession, base: Feeds) -> bool:
    """Whether a double model's float outputs are all float32 numbers off float32 inputs.

    Some double kernels compute in float32 (onnxruntime's Shrink; GroupNormalization with its
    default ``stash_type``): their differences at ``eps = 1e-6`` count float32 ulps. At inputs
    moved off the float32 grid (relative noise of 1e-9), a double computation gives outputs that
    are not float32 numbers; a float32 one (or a piecewise-constant output, for which the
    float32 oracle is as good) gives float32 numbers only.
    """
    rng = np.random.default_rng(11)
    probe = {
        k: v * (1.0 + 1e-9 * rng.standard_normal(np.shape(v)))
        if isinstance(v, np.ndarray) and v.dtype == np.float64
        else v
        for k, v in base.items()
    }
    if all(p is base[k] for k, p in probe.items()):
        return False
    try:
        out = _run(sess, probe)
    except Exception:
        return False
    values = [
        o[np.isfinite(o)]
        for o in out.values()
        if isinstance(o, np.ndarray) and o.dtype == np.float64 and o.size
    ]
    values = [v for v in values if v.size]
    if not values:
        return False
    return all(np.array_equal(v, v.astype(np.float32).astype(np.float64)) for v in values)


# --------------------------------------------------------------------------------------------
# comparisons at one point


class Mismatch(Exception):
    """The numbers disagree with the oracle (possibly because of a kink: re-checked elsewhere)."""


@dataclasses.dataclass
class _Point:
    """Everything both checks share at one input point.

    Attributes:
        feeds: The primal inputs.
        primal: The original model's outputs there.
        direction: The tangent ``v`` per selected input (zero where the input is not finite).
        seeds: The cotangent ``u`` per selected output (zero where the output is not finite).
        fd: Finite differences ``J v`` per selected output, or None with ``fd_error`` set.
        nonfinite: Whether the test data or the primal outputs hold NaN/inf; derivatives then
            legitimately contain NaN (0·inf...), so non-finite entries are left out.
        fmax: The largest finite primal output magnitude (rounding scale).
        frozen: Per input, elements onnxruntime admits no step of (:meth:`Oracle.frozen`);
            the direction is zero there and the element checks skip them.
    """

    feeds: Feeds
    base: Feeds
    primal: dict[str, Any]
    direction: dict[str, np.ndarray]
    seeds: dict[str, np.ndarray]
    fd: dict[str, np.ndarray] | None
    fd_error: str | None
    nonfinite: bool
    fmax: float
    frozen: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    ties: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def _unique_inputs(proto: onnx.ModelProto) -> dict[str, int | None]:
    """Graph inputs a top-level ``Unique`` reads, with its ``axis`` (None: flattened)."""
    names = {v.name for v in proto.graph.input}
    found: dict[str, int | None] = {}
    for node in proto.graph.node:
        if node.op_type == "Unique" and node.domain in ("", "ai.onnx") and node.input[0] in names:
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            found[node.input[0]] = axis
    return found


def tie_labels(x: np.ndarray, axis: int | None) -> np.ndarray:
    """Per element of ``x``, a label shared exactly by the elements Unique must keep equal.

    Unique's outputs have as many entries as ``x`` has distinct values (slices along
    ``axis``); the corpus data holds ties, and a random step splits them, so the output
    changes size and no difference quotient exists. The derivative exists only along steps
    that move equal values (the same position of equal slices) together: those carry one
    label here, and the oracle's directions are constant on each label.
    """
    if axis is None:
        inverse = np.unique(x.reshape(-1), return_inverse=True)[1]
        return np.asarray(inverse).reshape(x.shape)
    moved = np.moveaxis(x, axis, 0)
    width = int(np.prod(moved.shape[1:], dtype=np.int64))
    flat = moved.reshape(moved.shape[0], width)
    inverse = np.asarray(np.unique(flat, axis=0, return_inverse=True)[1]).reshape(-1)
    labels = inverse[:, None] * width + np.arange(width)[None, :]
    return np.moveaxis(labels.reshape(moved.shape), 0, axis)


def _shape_of(value: Any) -> Any:
    """The shape of an output; of a sequence, its elements' shapes (they may differ)."""
    if isinstance(value, list):
        return tuple(_shape_of(v) for v in value)
    return np.shape(value)


def _max_abs(arrays: Sequence[np.ndarray]) -> float:
    finite = [np.abs(a[np.isfinite(a)]) for a in (np.asarray(x, np.float64) for x in arrays)]
    return max((float(f.max()) for f in finite if f.size), default=0.0)


def _make_point(
    feeds: Feeds,
    primal_sess: ort.InferenceSession,
    oracle: Oracle,
    in_names: Sequence[str],
    out_names: Sequence[str],
    seed: int,
    unique: Mapping[str, int | None] | None = None,
) -> _Point:
    rng = np.random.default_rng(seed)
    primal = _run(primal_sess, feeds)
    finite_in = {x: np.isfinite(feeds[x]) for x in in_names}
    finite_out = {y: np.isfinite(np.asarray(primal[y])) for y in out_names}
    direction = {
        x: np.asarray(np.where(finite_in[x], rng.standard_normal(np.shape(feeds[x])), 0.0)).astype(
            feeds[x].dtype
        )
        for x in in_names
    }
    ties = {x: tie_labels(feeds[x], axis) for x, axis in (unique or {}).items() if x in direction}
    for x, labels in ties.items():
        values = rng.standard_normal(int(labels.max()) + 1 if labels.size else 0)
        direction[x] = np.asarray(values[labels]).astype(feeds[x].dtype)
    seeds = {
        y: np.asarray(
            np.where(finite_out[y], rng.standard_normal(np.shape(primal[y])), 0.0)
        ).astype(primal[y].dtype)
        for y in out_names
    }
    nonfinite = not all(m.all() for m in (*finite_in.values(), *finite_out.values()))
    base = oracle.base(feeds)
    fd, fd_error = None, None
    frozen: dict[str, np.ndarray] = {}
    if out_names and in_names:
        try:
            fd = oracle.fd(base, direction, out_names)
        except _ShapeChange as err:
            frozen = oracle.frozen(base, in_names)
            fd_error = "finite differences failed: " + _first_line(err)
            if any(m.any() for m in frozen.values()):
                for x, m in frozen.items():
                    direction[x] = np.where(m, 0, direction[x]).astype(direction[x].dtype)
                try:
                    fd, fd_error = oracle.fd(base, direction, out_names), None
                except Exception as again:
                    fd_error = "finite differences failed: " + _first_line(again)
        except Exception as err:
            fd_error = "finite differences failed: " + _first_line(err)
    fmax = _max_abs([primal[y] for y in out_names])
    return _Point(
        feeds, base, primal, direction, seeds, fd, fd_error, nonfinite, fmax, frozen, ties
    )


def _compare(
    name: str,
    got: np.ndarray,
    fd: np.ndarray,
    valid: np.ndarray,
    oracle: Oracle,
    fmax: float,
    lenient: bool,
) -> None:
    """Element-wise comparison of a derivative with finite differences where ``valid``.

    Raises:
        Mismatch: On a shape mismatch, a non-finite value, or numbers outside the tolerance.
    """
    if got.shape != fd.shape:
        raise Mismatch(f"{name}: shape {got.shape}, expected {fd.shape}")
    g64 = got.astype(np.float64)
    valid = valid.copy()
    if lenient:
        valid &= np.isfinite(fd) & np.isfinite(g64)
    if not np.isfinite(fd[valid]).all():
        raise Mismatch(
            f"{name}: finite differences not finite where the primal is (kink or domain edge)"
        )
    if not np.isfinite(g64[valid]).all():
        raise Mismatch(f"{name}: non-finite derivative where the primal is finite")
    if not valid.any():
        return
    scale = float(np.max(np.abs(fd[valid])))
    rtol, atol = oracle.tolerance(fmax)
    err = np.abs(g64[valid] - fd[valid])
    bound = atol + rtol * (np.abs(fd[valid]) + 0.1 * scale)
    if (err > bound).any():
        i = int(np.argmax(err - bound))
        raise Mismatch(
            f"{name}: max |got - fd| = {float(err.max()):.3g} (scale {scale:.3g}); "
            f"e.g. got {float(g64[valid][i]):.6g}, fd {float(fd[valid][i]):.6g}"
        )


def _inner(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], lenient: bool
) -> tuple[float, float, float]:
    """``(sum a·b, ||a||, ||b||)`` over the keys of ``a``; non-finite terms dropped when lenient."""
    total, na, nb = 0.0, 0.0, 0.0
    for k in a:
        x, y = a[k].astype(np.float64), np.asarray(b[k]).astype(np.float64)
        terms = x * y
        keep = np.isfinite(terms) if lenient else np.ones(terms.shape, bool)
        total += float(np.sum(terms[keep]))
        na += float(np.sum(x[keep] ** 2))
        nb += float(np.sum(y[keep] ** 2))
    return total, float(np.sqrt(na)), float(np.sqrt(nb))


def _adjoint_mismatch(
    what: str,
    lhs: tuple[float, float, float],
    rhs: tuple[float, float, float],
    rtol: float,
    atol: float,
) -> str | None:
    """None when ``<u, J v>`` and ``<Jᵀ u, v>`` agree to ``rtol`` of ``||u||·||Jv|| + ||v||·||Jᵀu||``.

    By Cauchy-Schwarz, relative errors of size ``rtol`` in either vector move the inner product
    by at most that much; ``atol`` covers float32 rounding relative to the primal magnitudes.
    """
    scale = lhs[1] * lhs[2] + rhs[1] * rhs[2]
    if abs(lhs[0] - rhs[0]) <= rtol * scale + atol:
        return None
    return f"adjoint identity vs {what}: <u, J v> = {lhs[0]:.7g}, <Jᵀ u, v> = {rhs[0]:.7g}"


def _primal_mismatch(point: _Point, got: Mapping[str, Any], which: str) -> str | None:
    mine = {k: got[k] for k in point.primal}
    # A half primal recomputed through an expansion (Attention's function body) rounds
    # differently from onnxruntime's fused kernel: a few half ulps.
    half = any(_is_half(v) for v in point.primal.values())
    rtol, atol = (HALF_RTOL, 1e-3) if half else (1e-4, 1e-5)
    if not _outputs_agree(point.primal, mine, rtol=rtol, atol=atol):
        return f"the {which} model's primal outputs differ from the original model's"
    return None


def _run_jvp(
    point: _Point,
    sess: ort.InferenceSession,
    direction: Mapping[str, np.ndarray],
    in_names: Sequence[str],
    out_names: Sequence[str],
    n_in: int,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Runs the jvp model along ``direction``: (all outputs, J v per selected output)."""
    tin = [i.name for i in sess.get_inputs()][n_in:]
    tout = [o.name for o in sess.get_outputs()][len(point.primal) :]
    feeds = dict(point.feeds)
    feeds.update({t: direction[x] for t, x in zip(tin, in_names, strict=True)})
    got = _run(sess, feeds)
    return got, {y: np.asarray(got[t]) for y, t in zip(out_names, tout, strict=True)}


def _check_jvp_at(
    point: _Point,
    sess: ort.InferenceSession,
    oracle: Oracle,
    in_names: Sequence[str],
    out_names: Sequence[str],
    n_in: int,
) -> tuple[str | None, dict[str, np.ndarray] | None]:
    """(None or the reason it disagrees, the computed J v per output)."""
    got, jv = _run_jvp(point, sess, point.direction, in_names, out_names, n_in)
    reason = _primal_mismatch(point, got, "jvp") or point.fd_error
    if reason is None and point.fd is not None:
        try:
            for y in out_names:
                valid = np.isfinite(np.asarray(point.primal[y], np.float64))
                _compare(f"fwd {y}", jv[y], point.fd[y], valid, oracle, point.fmax, point.nonfinite)
        except Mismatch as err:
            reason = str(err)
    return reason, jv


MAX_ELEMENTS = 128
"""Input elements whose cotangent is checked one by one against finite differences."""

MAX_COLUMNS = 4096
"""Largest direction that may be assembled column by column when no direction stays in the
operator's domain on either side (:meth:`Oracle.fd`)."""


def _check_vjp_elements(
    point: _Point,
    oracle: Oracle,
    adj: Mapping[str, np.ndarray],
    in_names: Sequence[str],
    out_names: Sequence[str],
    seed: int,
) -> None:
    """``(Jᵀu)_i = <u, J e_i>`` with ``J e_i`` by finite differences, for up to MAX_ELEMENTS i.

    Raises:
        Mismatch: When a cotangent element disagrees.
    """
    elements = [
        (x, i)
        for x in in_names
        for i in np.flatnonzero(
            np.isfinite(point.feeds[x])
            & ~point.frozen.get(x, np.zeros(np.shape(point.feeds[x]), bool))
        )
    ]
    if len(elements) > MAX_ELEMENTS:
        rng = np.random.default_rng(seed + 7)
        elements = [
            elements[k] for k in sorted(rng.choice(len(elements), MAX_ELEMENTS, replace=False))
        ]
    u_norm = float(
        np.sqrt(sum(float(np.sum(point.seeds[y].astype(np.float64) ** 2)) for y in out_names))
    )
    fmax = point.fmax * max(u_norm, 1.0)
    for x in in_names:
        if x in point.ties:
            _check_vjp_groups(point, oracle, adj, x, out_names, fmax)
            continue
        idx = [i for n, i in elements if n == x]
        if not idx:
            continue
        ref = np.empty(len(idx))
        for k, i in enumerate(idx):
            col = oracle.fd_element(point.base, x, int(i), out_names)
            terms = [point.seeds[y].astype(np.float64) * col[y] for y in out_names]
            if point.nonfinite:
                terms = [t[np.isfinite(t)] for t in terms]
            ref[k] = sum(float(np.sum(t)) for t in terms)
        got = adj[x].reshape(-1)[idx]
        _compare(f"adj {x}", got, ref, np.ones(len(idx), bool), oracle, fmax, point.nonfinite)


def _check_vjp_groups(
    point: _Point,
    oracle: Oracle,
    adj: Mapping[str, np.ndarray],
    x: str,
    out_names: Sequence[str],
    fmax: float,
) -> None:
    """Sums of ``Jᵀu`` over the tie groups of a Unique input (:func:`tie_labels`) against
    ``<u, J 1_g>``: a step of one tied element alone has no derivative, a step of its group has.
    """
    labels = point.ties[x]
    groups = np.unique(labels)[:MAX_ELEMENTS]
    ref = np.empty(len(groups))
    got = np.empty(len(groups))
    for k, g in enumerate(groups):
        mask = labels == g
        col = oracle.fd(point.base, {x: mask.astype(point.feeds[x].dtype)}, out_names)
        ref[k] = sum(float(np.sum(point.seeds[y].astype(np.float64) * col[y])) for y in out_names)
        got[k] = float(np.sum(adj[x].astype(np.float64)[mask]))
    _compare(f"adj {x} (tie groups)", got, ref, np.ones(len(groups), bool), oracle, fmax, False)


def _check_vjp_at(
    point: _Point,
    sess: ort.InferenceSession,
    oracle: Oracle,
    in_names: Sequence[str],
    out_names: Sequence[str],
    n_in: int,
    jvp: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None,
    jv: Mapping[str, np.ndarray] | None,
    seed: int,
) -> str | None:
    """None or the reason the vjp disagrees.

    ``jvp`` runs a jvp model that agreed with the differences (None if there is none) along a
    direction, and ``jv`` is its result along ``point.direction``. The adjoint identity is
    checked along the random direction and along ``v = Jᵀu`` itself: there ``<u, J v> =
    ||Jᵀu||²`` cannot cancel, so an error along ``Jᵀu`` (a wrong scale, say) always shows,
    whereas a random ``v`` may happen to be nearly orthogonal to it.
    """
    sin = [i.name for i in sess.get_inputs()][n_in:]
    cout = [o.name for o in sess.get_outputs()][len(point.primal) :]
    feeds = dict(point.feeds)
    feeds.update({s: point.seeds[y] for s, y in zip(sin, out_names, strict=True)})
    got = _run(sess, feeds)
    adj = {x: np.asarray(got[c]) for x, c in zip(in_names, cout, strict=True)}
    reason = _primal_mismatch(point, got, "vjp")
    if reason is not None:
        return reason
    for x in in_names:
        if adj[x].shape != np.shape(point.feeds[x]):
            return f"adj {x}: shape {adj[x].shape}, expected {np.shape(point.feeds[x])}"
    if not out_names:
        if any(np.any(a != 0) for a in adj.values()):
            return "nonzero cotangent although no float output is differentiated"
        return None
    lenient = point.nonfinite
    if not lenient and not all(np.isfinite(a).all() for a in adj.values()):
        return "non-finite cotangent (the data is finite)"
    rhs = _inner(point.direction, adj, lenient)
    u_l1 = sum(float(np.sum(np.abs(point.seeds[y]).astype(np.float64))) for y in out_names)
    if jvp is not None and jv is not None:
        rtol, atol = (
            (HALF_RTOL, 1e-3) if oracle.half else (1e-4, 1e-6) if oracle.float32 else (1e-10, 1e-12)
        )
        reason = _adjoint_mismatch(
            "the jvp model", _inner(point.seeds, jv, lenient), rhs, rtol, atol * point.fmax * u_l1
        )
        if reason is not None:
            return reason
        own = {
            x: np.where(np.isfinite(a) & np.isfinite(point.feeds[x]), a, 0).astype(a.dtype)
            for x, a in adj.items()
        }
        reason = _adjoint_mismatch(
            "the jvp model along v = Jᵀu",
            _inner(point.seeds, jvp(own), lenient),
            _inner(own, adj, lenient),
            rtol,
            atol * point.fmax * u_l1,
        )
        if reason is not None:
            return reason
    if point.fd_error is not None:
        return point.fd_error
    try:
        _check_vjp_elements(point, oracle, adj, in_names, out_names, seed)
    except Mismatch as err:
        return str(err)
    except Exception as err:
        return "finite differences failed: " + _first_line(err)
    if point.fd is not None:
        rtol, atol = oracle.tolerance(point.fmax)
        reason = _adjoint_mismatch(
            "finite differences", _inner(point.seeds, point.fd, lenient), rhs, rtol, atol * u_l1
        )
    return reason


# --------------------------------------------------------------------------------------------
# one case


_OPERATOR = re.compile(r"\b([a-z][\w.]*)::([A-Z]\w*)")
"""``domain::Op`` as onnax spells an operator in its messages (``ai.onnx::Resize``)."""


def _known_operator(domain: str, op: str) -> bool:
    with contextlib.suppress(Exception):
        return bool(onnx.defs.has(op, "" if domain == "ai.onnx" else domain))
    return False


def refusal_problem(message: str) -> str | None:
    """None when a refusal is a proper diagnostic, else what it lacks.

    A proper refusal names the operator (``domain::Op`` of an operator ONNX defines), says why
    (some explanation after the name: at least a clause, not the bare name) and gives a remedy
    (``Remedy:``, the wording every onnax diagnostic uses for it).
    """
    ops = [m for m in _OPERATOR.finditer(message) if _known_operator(m.group(1), m.group(2))]
    if not ops:
        return "names no operator as domain::Op"
    if "remedy" not in message.lower():
        return "gives no remedy"
    reason = _OPERATOR.sub("", message.split("Remedy", 1)[0].split("remedy", 1)[0])
    if len(reason.split()) < 6:
        return "gives no reason"
    return None


@dataclasses.dataclass
class _Built:
    """A transformed model and its session, or the status explaining why there is none."""

    sess: ort.InferenceSession | None = None
    status: tuple[str, str] | None = None


def _full_check_applies(proto: onnx.ModelProto) -> bool:
    """Whether the case's own model passes ``onnx.checker``'s full check (shape inference).

    A few do not, through no fault of theirs: MeanVarianceNormalization-13 without ``axes``
    (test_mvn) inlines onnx's function body, whose ``Constant(value_ints = @axes)`` gets no
    value when the attribute is left at its default. A generated model keeps the primal node and
    so fails the same way; it is then held to the structural check (and onnxruntime) only.
    """
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception:
        return False
    return True


MUTATED = "mutated source"
NONDETERMINISTIC = "nondeterministic result"
"""Details of the ``failed`` status for a broken contract: the transform changed its source
model, or gave other bytes on a second run or on a reloaded source."""


def _contract_problem(
    transform: Callable[[ir.Model], ir.Model], source: ir.Model, before: bytes, model: ir.Model
) -> str | None:
    """Whether a successful transform broke source isolation or determinism, and how."""
    if ir.to_proto(source).SerializeToString() != before:
        return MUTATED
    out = ir.to_proto(model).SerializeToString()
    again = ir.to_proto(transform(source)).SerializeToString()
    reloaded = ir.to_proto(transform(ir.from_proto(onnx.load_from_string(before))))
    if again != out or reloaded.SerializeToString() != out:
        return NONDETERMINISTIC
    return None


def _build(transform: Callable[[ir.Model], ir.Model], proto: onnx.ModelProto) -> _Built:
    source = ir.from_proto(proto)
    before = ir.to_proto(source).SerializeToString()
    try:
        model = transform(source)
        problem = _contract_problem(transform, source, before, model)
        if problem is not None:
            return _Built(status=("failed", problem))
    except onnax.OnnaxError as err:
        problem = refusal_problem(str(err))
        if problem is not None:
            return _Built(
                status=("failed", f"badly worded refusal ({problem}): {_first_line(err)}")
            )
        return _Built(status=("refused", _first_line(err)))
    except Exception as err:
        tb = traceback.extract_tb(err.__traceback__)
        where = f" [{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        return _Built(status=("crashed", _first_line(err) + where))
    full = _full_check_applies(proto)
    try:
        out = ir.to_proto(model)
        onnx.checker.check_model(out, full_check=full)
    except Exception as err:
        return _Built(status=("failed", "invalid model: " + _first_line(err)))
    try:
        return _Built(sess=_session(out))
    except Exception as err:
        return _Built(status=("failed", "onnxruntime cannot load: " + _first_line(err)))


PERTURBATIONS = {
    "mul": lambda x, z: x * (1.0 + 0.03 * z),
    "add": lambda x, z: x + 0.03 * (np.abs(x) + 1.0) * z,
    "up": lambda x, z: x + 0.01 * (np.abs(x) + 1.0) * np.abs(z),
}
"""Ways to move float inputs off kinks (``z`` standard normal noise): relative noise keeps signs
(and so domains like log's, but not a zero); additive noise moves zeros; a small upward shift
keeps integer-valued floats (OneHot depth, float indices) from crossing an integer downwards."""


def _perturbed(feeds: Feeds, names: Sequence[str], kind: str, seed: int) -> Feeds:
    rng = np.random.default_rng([seed, *kind.encode()])
    out = dict(feeds)
    for n in names:
        x = feeds[n]
        x64 = x.astype(np.float64)
        y = PERTURBATIONS[kind](x64, rng.standard_normal(x.shape))
        out[n] = np.asarray(np.where(np.isfinite(x64), y, x64)).astype(x.dtype)
    return out


def _antialias_scales(proto: onnx.ModelProto) -> list[str]:
    """Graph inputs that are the ``scales`` of a top-level antialiased Resize."""
    names = {v.name for v in proto.graph.input}
    return [
        node.input[2]
        for node in proto.graph.node
        if node.op_type == "Resize"
        and node.domain in ("", "ai.onnx")
        and len(node.input) > 2
        and node.input[2] in names
        and any(a.name == "antialias" and a.i for a in node.attribute)
    ]


def _off_antialias_kink(feeds: Feeds, names: Sequence[str]) -> Feeds:
    """The feeds with the downsampling scales among ``names`` raised by 0.5 %.

    Antialiased linear downsampling by ``s`` weighs input pixels by the tent
    ``max(0, 1 - s |d|)``, whose support edge moves with ``s``. At data like the corpus's
    (4 pixels, s = 0.6) an input pixel centre lies exactly on that edge (output centre 1/3,
    radius 5/3: pixel 2), so the derivative along ``s`` has a kink there: its one-sided values
    differ (-11.3 and -2.34) and central differences average them. A slightly larger scale
    keeps the output size and moves every centre off the edge, where the derivative exists.
    The perturbations of :data:`PERTURBATIONS` do not serve: they move the batch and channel
    scales off 1, which onnxruntime's linear kernel rejects, or change the output size.
    """
    out = dict(feeds)
    for n in names:
        x = feeds[n]
        out[n] = np.where((x > 0) & (x < 1), x * 1.005, x).astype(x.dtype)
    return out


def _check_point(
    feeds: Feeds,
    primal_sess: ort.InferenceSession,
    oracle: Oracle,
    built: Mapping[str, _Built],
    in_names: Sequence[str],
    out_names: Sequence[str],
    n_in: int,
    seed: int,
    unique: Mapping[str, int | None] | None = None,
) -> dict[str, str | None]:
    """Checks the built transforms at one point; maps transform -> None (agrees) or a reason."""
    point = _make_point(feeds, primal_sess, oracle, in_names, out_names, seed, unique)
    reasons: dict[str, str | None] = {}
    jv = None
    jvp_sess, vjp_sess = built["jvp"].sess, built["vjp"].sess
    if jvp_sess is not None:
        try:
            reasons["jvp"], jv = _check_jvp_at(point, jvp_sess, oracle, in_names, out_names, n_in)
        except Exception as err:
            reasons["jvp"] = "run failed: " + _first_line(err)
    if vjp_sess is not None:
        trusted = None
        if jvp_sess is not None and reasons.get("jvp") is None:  # a wrong jvp proves nothing
            session = jvp_sess

            def trusted(direction: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
                return _run_jvp(point, session, direction, in_names, out_names, n_in)[1]

        try:
            reasons["vjp"] = _check_vjp_at(
                point, vjp_sess, oracle, in_names, out_names, n_in, trusted, jv, seed
            )
        except Exception as err:
            reasons["vjp"] = "run failed: " + _first_line(err)
    return reasons


def _float_inputs(proto: onnx.ModelProto) -> tuple[list[str], list[str], list[str]]:
    """(graph input names, float input names, float output names), default selection order."""
    inits = {t.name for t in proto.graph.initializer} | {
        t.values.name for t in proto.graph.sparse_initializer
    }
    names = [v.name for v in proto.graph.input]
    floats = [
        v.name
        for v in proto.graph.input
        if v.name not in inits
        and v.type.WhichOneof("value") == "tensor_type"
        and v.type.tensor_type.elem_type in FLOAT_TYPES
    ]
    outs = [
        v.name
        for v in proto.graph.output
        if v.type.WhichOneof("value") == "tensor_type"
        and v.type.tensor_type.elem_type in FLOAT_TYPES
    ]
    return names, floats, outs


def _check_derivatives(
    proto: onnx.ModelProto,
    feeds: Feeds,
    primal_sess: ort.InferenceSession,
    first: Mapping[str, Any],
    deterministic: bool,
    in_names: Sequence[str],
    out_names: Sequence[str],
    selected: Sequence[str],
    seed: int,
    runtime: Runtime = _session,
) -> Result:
    """jvp and/or vjp (``selected``) of one case whose float inputs the test data holds."""
    n_in = len(proto.graph.input)
    # The vjp check trusts a jvp model that agreed with the differences, so the jvp is built
    # (and checked) whenever the vjp is wanted, even if it is not reported.
    built = {
        "jvp": _build(onnax.jvp, proto),
        "vjp": _build(onnax.vjp, proto) if "vjp" in selected else _Built(status=("skipped", "")),
    }
    results: Result = {t: b.status for t, b in built.items() if b.status is not None}
    pending = [t for t in selected if t not in results]
    if not pending:
        return {t: results[t] for t in selected}
    if not deterministic:
        # Finite differences of a random primal (Dropout with a seed, ...) mean nothing.
        for t in pending:
            results[t] = (
                "failed",
                "nondeterministic primal: no oracle applies (validity was checked)",
            )
        return {t: results[t] for t in selected}

    oracle = _make_oracle(proto, feeds, first, runtime)
    unique = _unique_inputs(proto)
    where = "f64 fd" if oracle.double else "f32 fd"
    if runtime is not _session:
        where += " through onnx.reference"
    if not out_names:
        where = "no float output: validity and zero cotangents only"
    points = [("", feeds)] + [
        (f"perturbed ({kind})", _perturbed(feeds, in_names, kind, seed)) for kind in PERTURBATIONS
    ]
    antialias = [n for n in _antialias_scales(proto) if n in feeds]
    if antialias:
        points.append(("scales off the antialiasing kink", _off_antialias_kink(feeds, antialias)))
    first_reason: dict[str, str] = {}
    shapes = {k: _shape_of(v) for k, v in first.items()}
    for label, point in points:
        if label:
            try:
                moved = {k: _shape_of(v) for k, v in _run(primal_sess, point).items()}
            except Exception:
                continue  # the perturbation left the operator's domain (Upsample's scales < 1)
            if moved != shapes:
                continue  # the perturbation changed an output's size: the models are not built for it
        reasons = _check_point(
            point, primal_sess, oracle, built, in_names, out_names, n_in, seed, unique
        )
        for t in list(pending):
            reason = reasons.get(t)
            if reason is None:
                detail = f"{where}" + (f", {label}" if label else "")
                results[t] = ("pass", detail)
                pending.remove(t)
            else:
                first_reason.setdefault(t, reason)
        if not pending:
            break
    for t in pending:
        results[t] = ("failed", f"{first_reason[t]} [{where}; also at perturbed inputs]")
    return {t: results[t] for t in selected}


# --------------------------------------------------------------------------------------------
# vmap: against a loop of single-example runs of the primal

VMAP_BATCH = 3
"""Examples per batch: ``data_sets[0]`` and two perturbed copies."""

VMAP_RTOL = {8: 1e-10, 4: 1e-5, 2: 1e-2, 1: 0.0}
"""Tolerance of float outputs by item size (double, float, float16/bfloat16, float8). The
batched model computes the same function, so only rounding differs (another summation order in
a batched MatMul, a fused kernel): a few ulps of the output's scale. float8 must be exact: one
ulp is 12-25 %."""


def _float_like(a: np.ndarray) -> bool:
    """float16/32/64 and the ml_dtypes floats (bfloat16, float8...), which numpy calls 'V'."""
    return a.dtype.kind == "f" or "float" in a.dtype.name


def _stack(values: Sequence[Any]) -> Any:
    """Examples stacked along a new axis 0, through sequences (a list of stacked elements, the
    layout a batched ``seq(tensor)`` type declares) and empty optionals (None).

    Raises:
        ValueError: When the examples differ in structure (sequence lengths, None or not).
    """
    v0 = values[0]
    if isinstance(v0, np.ndarray):
        return np.stack(values, axis=0)
    if isinstance(v0, list):
        if any(not isinstance(v, list) or len(v) != len(v0) for v in values):
            raise ValueError("sequences of different lengths cannot be batched")
        return [_stack([v[k] for v in values]) for k in range(len(v0))]
    if v0 is None:
        if any(v is not None for v in values):
            raise ValueError("an optional that is empty in some examples only")
        return None
    raise ValueError(f"cannot batch a {type(v0).__name__}")


def _signature(value: Any) -> Any:
    """Structure, shapes and dtypes of a value (an output whose signature changes under a
    perturbation cannot be stacked)."""
    if isinstance(value, np.ndarray):
        return (value.shape, value.dtype)
    if isinstance(value, list):
        return [_signature(v) for v in value]
    return type(value).__name__


def _vmap_mismatch(name: str, got: Any, want: Any) -> str | None:
    """None when the batched output equals the stacked single-example outputs."""
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return f"{name}: a sequence of {len(got)} elements, expected {len(want)}"
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            reason = _vmap_mismatch(f"{name}[{k}]", g, w)
            if reason is not None:
                return reason
        return None
    if not isinstance(want, np.ndarray) or not isinstance(got, np.ndarray):
        if type(got) is not type(want):
            return f"{name}: got a {type(got).__name__}, expected a {type(want).__name__}"
        return None  # both None (empty optionals)
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype}, expected {want.dtype}"
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, expected {want.shape}"
    if not _float_like(want):
        if not np.array_equal(got, want):
            bad = int(np.sum(got != want))
            return f"{name}: {bad} of {want.size} elements differ (exact comparison)"
        return None
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(g64), np.isnan(w64)):
        return f"{name}: NaN where the single-example runs have none, or the reverse"
    inf = np.isinf(w64)
    if not np.array_equal(np.isinf(g64), inf) or not np.array_equal(g64[inf], w64[inf]):
        return f"{name}: infinities differ from the single-example runs"
    finite = np.isfinite(w64)
    if not finite.any():
        return None
    # Relative to each example's own scale, so that a small-valued example is not hidden
    # behind a large one.
    scale = np.abs(np.where(finite, w64, 0.0)).reshape(len(w64), -1).max(axis=1)
    scale = scale.reshape((-1,) + (1,) * (w64.ndim - 1))
    rtol = VMAP_RTOL.get(want.dtype.itemsize, 0.0)
    err = np.where(finite, np.abs(g64 - w64), 0.0)
    bound = rtol * (np.abs(w64) + scale)
    if (err > bound).any():
        i = np.unravel_index(int(np.argmax(err - bound)), err.shape)
        return (
            f"{name}: max |batched - loop| = {float(err.max()):.3g} (example {i[0]}, "
            f"scale {float(scale.reshape(-1)[i[0]]):.3g}); at {tuple(int(k) for k in i)} "
            f"got {float(g64[i]):.7g}, loop {float(w64[i]):.7g}"
        )
    return None


def _vmap_examples(
    feeds: Feeds,
    batched: Sequence[str],
    primal_sess: ort.InferenceSession,
    first: Mapping[str, Any],
    seed: int,
) -> tuple[list[Feeds], list[dict[str, Any]], list[int]]:
    """(examples, their primal outputs, indices of examples that are identical copies).

    Example 0 is ``feeds``. The others perturb the floating-point arrays among the ``batched``
    inputs (relative and additive noise of 5 %, non-finite entries kept); integer, bool and
    string inputs are copied. An example whose perturbation changes an output's shape or type,
    or that onnxruntime cannot run (a float that is a size or an index), is an identical copy.
    """
    rng = np.random.default_rng([seed, 7])
    signature = {k: _signature(v) for k, v in first.items()}

    def perturb(x: Any) -> Any:
        if isinstance(x, list):  # a sequence: its float elements
            return [perturb(e) for e in x]
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f" or not x.size:
            return x
        x64 = x.astype(np.float64)
        y = x64 + 0.05 * (np.abs(x64) + 1.0) * rng.standard_normal(x.shape)
        return np.asarray(np.where(np.isfinite(x64), y, x64)).astype(x.dtype)

    examples: list[Feeds] = [dict(feeds)]
    outputs: list[dict[str, Any]] = [dict(first)]
    copies: list[int] = []
    for b in range(1, VMAP_BATCH):
        example = dict(feeds)
        for n in batched:
            example[n] = perturb(feeds[n])
        out: dict[str, Any] | None = None
        if any(not _same(example[n], feeds[n]) for n in batched):
            try:
                out = _run(primal_sess, example)
                if {k: _signature(v) for k, v in out.items()} != signature:
                    out = None
            except Exception:
                out = None
            if out is None:
                copies.append(b)
        if out is None:
            example, out = dict(feeds), dict(first)
        examples.append(example)
        outputs.append(out)
    return examples, outputs, copies


def _same(a: Any, b: Any) -> bool:
    """Whether a perturbed input is still the original (nothing in it was perturbed)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a is b


def _check_vmap_variant(
    proto: onnx.ModelProto,
    feeds: Feeds,
    primal_sess: ort.InferenceSession,
    first: Mapping[str, Any],
    deterministic: bool,
    in_axes: int | dict[str, int],
    seed: int,
) -> tuple[str, str]:
    """vmap with ``in_axes`` (0: every graph input; a dict: those inputs, the others shared)."""
    built = _build(lambda m: onnax.vmap(m, in_axes=in_axes), proto)
    if built.status is not None:
        return built.status
    assert built.sess is not None
    if not deterministic:
        # vmap accepted a random primal (its default randomness="error" refuses random
        # operators, so this is a primal that is random without one of them): no loop
        # reproduces its numbers.
        return ("failed", "nondeterministic primal: no oracle applies (validity was checked)")
    batched = list(feeds) if isinstance(in_axes, int) else [n for n in feeds if n in in_axes]
    examples, singles, copies = _vmap_examples(feeds, batched, primal_sess, first, seed)
    stacked: Feeds = dict(feeds)
    for n in batched:
        stacked[n] = _stack([e[n] for e in examples])
    try:
        got = _run(built.sess, stacked)
    except Exception as err:
        return ("failed", "run failed: " + _first_line(err))
    if set(got) != set(first):
        return ("failed", f"outputs {sorted(got)}, expected {sorted(first)}")
    for y in first:
        reason = _vmap_mismatch(y, got[y], _stack([s[y] for s in singles]))
        if reason is not None:
            return ("failed", reason)
    detail = ""
    if copies:
        detail = f"examples {copies} are identical copies (a perturbation changes an output)"
    return ("pass", detail)


_SEVERITY = {"crashed": 0, "failed": 1, "refused": 2, "skipped": 3, "pass": 4}


def _check_vmap(
    proto: onnx.ModelProto,
    feeds: Feeds,
    primal_sess: ort.InferenceSession,
    first: Mapping[str, Any],
    deterministic: bool,
    in_names: Sequence[str],
    seed: int,
) -> tuple[str, str]:
    """Both vmap variants; the worse status wins, its detail prefixed by the variant.

    The second variant (only the first float input batched, by a dict) is left out when the
    case has no float input or that is its only input (it would repeat the first).
    """
    if not feeds:
        # Nothing to map over (Constant, RandomNormal...): vmap rightly refuses.
        return ("skipped", "no graph input to batch")
    variants: list[tuple[str, int | dict[str, int]]] = [("in_axes=0", 0)]
    if in_names and len(feeds) > 1:
        variants.append((f"in_axes={{{in_names[0]!r}: 0}}", {in_names[0]: 0}))
    outcomes = [
        (label, _check_vmap_variant(proto, feeds, primal_sess, first, deterministic, axes, seed))
        for label, axes in variants
    ]
    label, (status, detail) = min(outcomes, key=lambda o: _SEVERITY[o[1][0]])
    if status == "refused" and any(s == "pass" for _, (s, _) in outcomes):
        # Batching every input also batches integer inputs that act as attributes (Reduce*'s
        # axes, Reshape's shape, Slice's starts): a per-example value there has no batched
        # equivalent, and vmap rightly refuses. The variant batching a float input then shows
        # whether the batch rule itself works: pass, with the refusal kept in the detail.
        status = "pass"
    if status == "pass":
        notes = [f"{lb}: {s + ' ' if s != 'pass' else ''}{d}" for lb, (s, d) in outcomes if d]
        return ("pass", "; ".join(notes))
    return (status, f"{label}: {detail}")


def check_case(testcase: Any, seed: int = 0, transforms: Sequence[str] = TRANSFORMS) -> Result:
    """Checks onnax.jvp, onnax.vjp and onnax.vmap on one ONNX backend node test case.

    Args:
        testcase: An ``onnx.backend.test.case.test_case.TestCase`` (``.model``, ``.data_sets``).
        seed: Seed of the random directions, cotangent seeds and perturbations.
        transforms: The transforms to check (a subset of :data:`TRANSFORMS`).

    Returns:
        transform -> (status, detail) for the selected transforms (in :data:`TRANSFORMS`
        order), status one of :data:`STATUSES`, and :data:`SCOPE` -> ``("in", "")`` or
        ``("out", reason)``. An empty detail on ``pass``; on ``pass`` after a re-check at a
        perturbed input, or a vmap batch with identical copies, the detail says so. Out of
        scope, jvp and vjp are ``skipped``; vmap is still checked when onnxruntime runs the case.
    """
    selected = [t for t in TRANSFORMS if t in transforms]
    unknown = set(transforms) - set(TRANSFORMS)
    if unknown:
        raise ValueError(f"unknown transforms {sorted(unknown)}; choose from {TRANSFORMS}")
    proto: onnx.ModelProto = testcase.model
    names, in_names, out_names = _float_inputs(proto)
    data_inputs = testcase.data_sets[0][0] if testcase.data_sets else []
    inits = {t.name for t in proto.graph.initializer}
    graph_inputs = [n for n in names if n not in inits]
    feeds: Feeds = {n: _to_feed(v) for n, v in zip(graph_inputs, data_inputs, strict=False)}
    results: Result = {}
    out_of_scope = None
    if not in_names:
        out_of_scope = "no FLOAT/DOUBLE graph input"
    elif any(n not in feeds for n in in_names) or any(
        not _is_float_array(feeds[n]) for n in in_names
    ):
        out_of_scope = "test data lacks float inputs"
    derivatives = [t for t in selected if t in ("jvp", "vjp")]
    if out_of_scope is not None:
        results.update(dict.fromkeys(derivatives, ("skipped", out_of_scope)))
        derivatives = []
    try:
        primal_sess = _session(proto)
        first = _run(primal_sess, feeds)
        second = _run(primal_sess, feeds)
    except Exception as err:
        reason = "onnxruntime cannot run the primal: " + _first_line(err)
        for t in selected:
            results.setdefault(t, ("skipped", reason))
        return {**{t: results[t] for t in selected}, SCOPE: ("out", out_of_scope or reason)}
    deterministic = _outputs_agree(first, second, rtol=0.0, atol=0.0)
    runtime = _primal_runtime(testcase, proto, feeds, first) if deterministic else _session
    if runtime is not _session:
        primal_sess = runtime(proto)
        first = _run(primal_sess, feeds)
    if derivatives:
        results.update(
            _check_derivatives(
                proto,
                feeds,
                primal_sess,
                first,
                deterministic,
                in_names,
                out_names,
                derivatives,
                seed,
                runtime,
            )
        )
    if "vmap" in selected:
        results["vmap"] = _check_vmap(
            proto, feeds, primal_sess, first, deterministic, in_names, seed
        )
    scope = ("out", out_of_scope) if out_of_scope is not None else ("in", "")
    return {**{t: results[t] for t in selected}, SCOPE: scope}


# --------------------------------------------------------------------------------------------
# the corpus


def collect_cases(filter_: str | None = None, limit: int | None = None) -> list[Any]:
    """The node test cases (sorted by name), optionally filtered by a name substring."""
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = sorted(node_cases.collect_testcases(None), key=lambda c: c.name)
    if filter_:
        cases = [c for c in cases if filter_ in c.name]
    return cases[:limit] if limit is not None else cases


_REFUSED_OP = re.compile(r"([\w.]+::\w+)")


def refused_operator(detail: str) -> str:
    """The ``domain::op`` a refusal names, or the error class when it names none."""
    m = _REFUSED_OP.search(detail)
    if m:
        return m.group(1)
    return _VARIANT.sub("", detail).split(":", 1)[0]


_VARIANT = re.compile(r"^in_axes=(0|\{.*?\}): ")
"""The vmap variant a vmap detail starts with."""

_REFUSED_VARIANT = re.compile(r"in_axes=(?:0|\{.*?\}): refused (.*?)(?=; in_axes=|$)")
"""A refused variant noted in the detail of a vmap pass."""

_CASES: list[Any] = []
_SELECTED: tuple[str, ...] = TRANSFORMS


def _worker(index: int, conn: multiprocessing.connection.Connection) -> None:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            result: Result = check_case(_CASES[index], transforms=_SELECTED)
        except Exception as err:  # a bug of the driver itself: say so rather than hide it
            result = dict.fromkeys(_SELECTED, ("crashed", "driver error: " + _first_line(err)))
            result[SCOPE] = ("in", "")
    conn.send(result)
    conn.close()


def run_corpus(
    cases: Sequence[Any],
    jobs: int = 2,
    timeout: float = 60.0,
    progress: bool = True,
    transforms: Sequence[str] = TRANSFORMS,
) -> dict[str, Result]:
    """Runs :func:`check_case` on every case, each in its own forked process with a timeout.

    A fork per case isolates crashes (a segfault in onnxruntime) and lets a pathological case be
    killed at its deadline; the parent never creates a session, so forking is safe.
    """
    global _CASES, _SELECTED
    from onnax.rules import collect

    collect()  # once here rather than in every forked worker (imports only, fork-safe)
    _CASES = list(cases)
    _SELECTED = tuple(t for t in TRANSFORMS if t in transforms)
    ctx = multiprocessing.get_context("fork")
    results: dict[str, Result] = {}
    queue = list(range(len(_CASES)))
    running: dict[int, tuple[Any, multiprocessing.connection.Connection, float]] = {}
    done = 0
    while queue or running:
        while queue and len(running) < max(1, jobs):
            i = queue.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(i, child), daemon=True)
            proc.start()
            child.close()
            running[i] = (proc, parent, time.monotonic() + timeout)
        ready = multiprocessing.connection.wait([r[1] for r in running.values()], timeout=0.5)
        now = time.monotonic()
        for i, (proc, conn, deadline) in list(running.items()):
            name = _CASES[i].name
            if conn in ready:
                try:
                    results[name] = conn.recv()
                except EOFError:
                    proc.join(5)
                    results[name] = {
                        **dict.fromkeys(
                            _SELECTED, ("crashed", f"worker died (exit code {proc.exitcode})")
                        ),
                        SCOPE: ("in", ""),
                    }
            elif now > deadline:
                proc.kill()
                results[name] = {
                    **dict.fromkeys(_SELECTED, ("crashed", f"timeout after {timeout:g} s")),
                    SCOPE: ("in", ""),
                }
            else:
                continue
            proc.join(5)
            conn.close()
            del running[i]
            done += 1
            if progress:
                print(f"\r[{done}/{len(_CASES)}] {name:<60}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return results


def _counts(results: Mapping[str, Result], t: str, names: Collection[str]) -> str:
    counts = collections.Counter(results[n][t][0] for n in names if t in results[n])
    return ", ".join(f"{s} {counts.get(s, 0)}" for s in STATUSES if s != "skipped")


def in_scope(results: Mapping[str, Result]) -> list[str]:
    """Names of the in-scope cases (sorted)."""
    return sorted(n for n, r in results.items() if r.get(SCOPE, ("in", ""))[0] == "in")


_ACTIVE_INPUT = re.compile(r"(?:through|gets a batched \w+ \()?input (\d+) '")


def schema_category(detail: str, opset: int = 28) -> str:
    """The schema's ``differentiation_category`` of the input a refusal names, if it names one.

    ``NonDifferentiable`` there means the operator's schema itself says the derivative does not
    exist (refusing is the documented answer); ``Differentiable``/``Unknown`` means a rule or a
    case is missing.
    """
    m = _OPERATOR.search(detail)
    k = _ACTIVE_INPUT.search(detail)
    if not m or not k:
        return "?"
    domain = "" if m.group(1) == "ai.onnx" else m.group(1)
    try:
        schema = onnx.defs.get_schema(m.group(2), opset, domain)
        formal = schema.inputs[min(int(k.group(1)), len(schema.inputs) - 1)]
        return str(formal.differentiation_category).rsplit(".", 1)[-1]
    except Exception:
        return "?"


def _reason(detail: str) -> str:
    """The refusal's reason without names of values (so that equal reasons group together)."""
    text = _VARIANT.sub("", detail)
    text = re.sub(r"^\w+Error: ", "", text)
    text = re.sub(r"\(the node producing '[^']*'\)|\(node '[^']*'\)", "", text)
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"at opset \d+", "", text)
    text = " ".join(text.split())
    return text.split(". Remedy")[0][:110]


def summarize(results: Mapping[str, Result], verbose: bool = False) -> str:
    """The report: per transform the in-scope counts and % pass, the failures and crashes with
    reasons, and the refused operators grouped, with the reason and the schema's category of
    the input the derivative reaches them through."""
    present = [t for t in TRANSFORMS if any(t in r for r in results.values())]
    scope = in_scope(results)
    outside = sorted(set(results) - set(scope))
    lines = [f"{len(scope)} cases in scope (of {len(results)}); {len(outside)} out of scope:"]
    why = collections.Counter(
        results[n][SCOPE][1].split(":")[0] for n in outside if SCOPE in results[n]
    )
    lines.extend(f"  {k}: {v}" for k, v in why.most_common())
    lines.append("")
    lines.append(f"{'':6}{'pass':>7}{'refused':>9}{'failed':>8}{'crashed':>9}{'% pass':>9}")
    for t in present:
        counts = collections.Counter(results[n][t][0] for n in scope if t in results[n])
        total = sum(counts.values())
        pct = 100.0 * counts.get("pass", 0) / total if total else 0.0
        lines.append(
            f"{t:6}{counts.get('pass', 0):>7}{counts.get('refused', 0):>9}"
            f"{counts.get('failed', 0):>8}{counts.get('crashed', 0):>9}{pct:>8.1f}%"
        )
        assert counts.get("skipped", 0) == 0, "an in-scope case was skipped"
    contract = {
        problem: sum(
            1
            for r in results.values()
            for t in present
            if t in r and r[t][0] == "failed" and r[t][1].startswith(problem)
        )
        for problem in (MUTATED, NONDETERMINISTIC)
    }
    lines.append(
        "contract (every case and transform, counted as failed): "
        + ", ".join(f"{k} {v}" for k, v in contract.items())
    )
    if "vmap" in present:
        ran = [n for n in outside if results[n]["vmap"][0] != "skipped"]
        lines.append(
            f"vmap outside the scope, on the {len(ran)} cases without a float input that "
            "onnxruntime runs: " + _counts(results, "vmap", ran)
        )
    derivatives = [t for t in present if t != "vmap"]
    if derivatives:
        perturbed = collections.Counter(
            t
            for n in scope
            for t in derivatives
            if results[n][t][0] == "pass" and "perturbed" in results[n][t][1]
        )
        f32 = collections.Counter(
            t
            for n in scope
            for t in derivatives
            if results[n][t][0] == "pass" and "f32 fd" in results[n][t][1]
        )
        lines.append(
            "passes needing a perturbed input: "
            + ", ".join(f"{t} {perturbed.get(t, 0)}" for t in derivatives)
            + "; passes checked with float32 differences: "
            + ", ".join(f"{t} {f32.get(t, 0)}" for t in derivatives)
        )
    if "vmap" in present:
        partial = collections.Counter(
            refused_operator(m.group(1))
            for n in scope
            if results[n]["vmap"][0] == "pass"
            for m in _REFUSED_VARIANT.finditer(results[n]["vmap"][1])
        )
        lines.append(
            f"vmap passes with one variant refused ({sum(partial.values())}), by "
            "operator: " + ", ".join(f"{op} {k}" for op, k in partial.most_common())
        )
    for status in ("failed", "crashed"):
        items = [
            (name, t, results[name][t][1])
            for name in scope
            for t in present
            if results[name][t][0] == status
        ]
        lines.append(f"\n{status.upper()} ({len(items)}):")
        lines.extend(f"  {name} [{t}]: {detail}" for name, t, detail in items)
    for t in present:
        groups: dict[tuple[str, str, str], list[str]] = collections.defaultdict(list)
        for n in scope:
            status, detail = results[n][t]
            if status == "refused":
                key = (refused_operator(detail), schema_category(detail), _reason(detail))
                groups[key].append(n)
        total = sum(len(v) for v in groups.values())
        lines.append(f"\nREFUSED ({t}, {total} cases), by operator [input's schema category]:")
        by_op: dict[str, list[tuple[str, str, list[str]]]] = collections.defaultdict(list)
        for (op, category, reason), names in groups.items():
            by_op[op].append((category, reason, names))
        for op, entries in sorted(by_op.items(), key=lambda kv: -sum(len(e[2]) for e in kv[1])):
            lines.append(f"  {op}: {sum(len(e[2]) for e in entries)}")
            for category, reason, names in sorted(entries, key=lambda e: -len(e[2])):
                example = names[0] + (f" +{len(names) - 1}" if len(names) > 1 else "")
                lines.append(f"      [{category}] {len(names)} x {reason}  ({example})")
    if verbose:
        lines.append("\nALL:")
        for name, r in sorted(results.items()):
            lines.append(f"  {name}: " + "; ".join(f"{t} {r[t][0]} {r[t][1]}" for t in present))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default=None, help="only cases whose name contains this")
    parser.add_argument("--limit", type=int, default=None, help="at most this many cases")
    parser.add_argument("--jobs", type=int, default=2, help="parallel worker processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument(
        "--transforms",
        default=",".join(TRANSFORMS),
        help=f"comma-separated transforms to check (default: {','.join(TRANSFORMS)})",
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--verbose", action="store_true", help="list every case's result")
    args = parser.parse_args(argv)
    transforms = [t.strip() for t in args.transforms.split(",") if t.strip()]
    unknown = [t for t in transforms if t not in TRANSFORMS]
    if unknown or not transforms:
        parser.error(f"--transforms: unknown {unknown}; choose from {','.join(TRANSFORMS)}")
    cases = collect_cases(args.filter, args.limit)
    start = time.perf_counter()
    results = run_corpus(cases, args.jobs, args.timeout, transforms=transforms)
    elapsed = time.perf_counter() - start
    print(f"{len(cases)} node test cases in {elapsed:.0f} s (jobs={args.jobs})")
    print(summarize(results, args.verbose))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
