"""Rematerialization in reverse mode (``remat=``), like ``jax.checkpoint``.

After linearize + transpose the reverse sweep reads forward values (the *residuals*: the
activations a ``MatMul`` multiplies by, ``1 - tanh(x)²``...), so a runtime keeps each of them
alive from the forward step that makes it to the backward step that reads it: the peak memory
of a gradient grows with the depth of the network. This post-pass trades compute for memory:
it decides which residuals stay *stored* and makes the backward read a *recomputed* copy of the
others, cloned from the nearest stored values.

Two things make a recomputed copy real rather than a promise a runtime breaks:

* **It must differ from its forward copy.** A clone reading the same inputs as the forward node
  is one common subexpression (onnax's cleanup and onnxruntime's
  ``CommonSubexpressionElimination`` at ``ORT_ENABLE_BASIC`` and above both merge it back). Every
  clone that reads only stored values therefore reads one of them through
  ``Where(c, a, a)`` with ``c`` a boolean computed from a backward value: exactly ``a``
  whatever ``c`` is (inf and NaN included, unlike ``a + 0·g``), and no rewrite of onnax or of
  onnxruntime folds a ``Where`` whose condition is not a constant.
* **It must run late.** ``c`` depends on the reverse sweep just before the first backward node
  that reads the recomputed values, so no schedule can run the recomputation earlier: the
  forward copies die after their forward consumers and the clones live only across their part
  of the backward.

The residuals are grouped by their position in the forward sweep into about ``sqrt(n)``
segments (``n`` forward nodes, as in Chen et al.'s sublinear checkpointing): the clones of one
segment are shared by its backward nodes, so a value is recomputed once per segment that needs
it, not once per reader.

The policies: ``"recompute"`` keeps nothing but what is always kept (below); a list of op
types keeps those operators' outputs too (``jax.checkpoint_policies.save_only_these_names``
by operator); an int budget keeps, greedily, the forward values that cost most to recompute per
byte stored (a ``MatMul``, ``Gemm`` or ``Conv`` output: its contracted size per element;
anything else: one operation per element), the latest first among equals, while their static
sizes fit in the budget (what is always kept is charged first). A value with a dynamic
dimension has no static size: a budget never keeps it, it is recomputed.

Always stored, whatever the policy: graph inputs, initializers, constants and shape arithmetic
(values computed only from ``Shape``, ``Size`` and constants, which are small and cheap), graph
outputs (alive to the end anyway), outputs of ``If``, ``Loop`` and ``Scan`` (a recomputed loop
would run all its iterations again; the residual Scans of reverse mode stay stored), outputs of
random operators (a second draw would differ) and non-tensor values.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Sequence
from typing import Literal

import onnx
import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.inference import infer_shapes
from onnax.core.subgraphs import graph_attributes, subgraph_reads
from onnax.core.traverse import sort
from onnax.errors import OnnaxError

__all__ = ["Remat", "RematError", "RematPolicy", "RematStats", "check_remat", "rematerialize"]

Remat = str | Sequence[str] | int
"""``"store"``, ``"recompute"``, a sequence of op types whose outputs are stored, or a budget in
bytes for the stored residuals."""

_RANDOM = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)
_SHAPE_OPS = frozenset({"Shape", "Size"})
_FLOATS = frozenset(
    {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
)
# The element types of onnxruntime's CPU Where kernel (opset 16): a gate on another type
# would not load.
_WHERE_TYPES = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.DOUBLE,
        ir.DataType.FLOAT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT8,
    }
)
# A rough multiply-add count per output element of the operators that dominate a forward
# sweep; every other operator counts one operation per output element.
_CONTRACTIONS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})


class RematError(OnnaxError, ValueError, TypeError):
    """A ``remat=`` value that is not a known policy (a ValueError, or TypeError for a wrong type)."""


@dataclasses.dataclass(frozen=True)
class RematPolicy:
    """A checked ``remat=`` value.

    Attributes:
        kind: ``"store"``, ``"recompute"``, ``"ops"`` (store ``ops``' outputs) or ``"budget"``.
        ops: The op types whose outputs are stored (kind ``"ops"``).
        budget: The byte budget of the stored residuals (kind ``"budget"``).
    """

    kind: Literal["store", "recompute", "ops", "budget"]
    ops: frozenset[str] = frozenset()
    budget: int = 0


@dataclasses.dataclass
class RematStats:
    """What :func:`rematerialize` did (for benchmarks and tests).

    Attributes:
        residual_bytes: Static bytes of every residual the store plan keeps (values with a
            dynamic dimension are not counted).
        kept_bytes: Static bytes of the residuals that stay stored under the policy.
        recomputed: Number of nodes cloned into the reverse sweep.
        segments: Number of recomputation segments (distinct gates).
    """

    residual_bytes: int = 0
    kept_bytes: int = 0
    recomputed: int = 0
    segments: int = 0


def _known_op_types() -> set[str]:
    from onnax.rules.custom import registered

    names = {schema.name for schema in onnx.defs.get_all_schemas_with_history()}
    return names | {op for _, op in registered()}


def check_remat(remat: object, transform: str) -> RematPolicy:
    """Checks a ``remat=`` argument and returns its policy.

    Raises:
        RematError: On a wrong type, an unknown string, an unknown op type (with the close
            matches) or a negative budget.
    """
    if isinstance(remat, str):
        if remat in ("store", "recompute"):
            return RematPolicy(remat)  # type: ignore[arg-type]
        close = difflib.get_close_matches(remat, ["store", "recompute"], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RematError(
            f"{transform}: remat={remat!r} is not a policy{hint}; expected 'store', 'recompute', "
            "a list of op types whose outputs are stored (e.g. ['Conv', 'MatMul', 'Gemm']) or "
            "a budget in bytes (an int >= 0). Pass one of those."
        )
    if isinstance(remat, bool) or not isinstance(remat, int | list | tuple):
        raise RematError(
            f"{transform}: remat must be 'store', 'recompute', a list of op types or an int "
            f"budget in bytes, got {type(remat).__name__} {remat!r}. Pass one of those "
            "(e.g. remat=['MatMul'] or remat=100_000_000)."
        )
    if isinstance(remat, int):
        if remat < 0:
            raise RematError(
                f"{transform}: remat budget is {remat} bytes, expected an int >= 0. Pass a "
                "non-negative byte count (0 stores no residual, like remat='recompute')."
            )
        return RematPolicy("budget", budget=remat)
    known = _known_op_types()
    for op in remat:
        if not isinstance(op, str):
            raise RematError(
                f"{transform}: remat lists {op!r} ({type(op).__name__}), expected op type "
                "names (str) such as 'MatMul'. Pass the op types as strings."
            )
        if op not in known:
            close = difflib.get_close_matches(op, sorted(known), n=3)
            hint = f"; close matches: {close}" if close else ""
            raise RematError(
                f"{transform}: remat lists {op!r}, which is not an ONNX operator type{hint}. "
                "Spell the op types as in the model's nodes (e.g. 'Conv', 'MatMul', 'Gemm')."
            )
    return RematPolicy("ops", ops=frozenset(remat))


# --------------------------------------------------------------------------- analysis
def _static_bytes(value: ir.Value) -> int | None:
    shape, dtype = value.shape, value.dtype
    if shape is None or dtype is None or not shape.is_static() or dtype == ir.DataType.STRING:
        return None
    return int(math.prod(int(d) for d in shape.numpy()) * dtype.itemsize)


def _is_tensor(value: ir.Value) -> bool:
    return value.type is None or isinstance(value.type, ir.TensorType)


def _cheap(nodes: Sequence[ir.Node]) -> set[ir.Value]:
    """Constants, weights' transforms and shape arithmetic: what is never worth recomputing.

    Values computed from constants and initializers only are folded into initializers by
    onnxruntime (``Transpose(W)``): storing them is what happens anyway. Values computed from
    ``Shape``, ``Size`` and such are small unless they are floating point (``ConstantOfShape``
    of a run-time shape is tensor-sized and is recomputed like any other value).
    """
    folded: set[ir.Value] = set()
    cheap: set[ir.Value] = set()
    for node in nodes:
        if graph_attributes(node) or node.op_type in _RANDOM:
            continue
        inputs = [v for v in node.inputs if v is not None]
        if node.op_type == "Constant" or all(v in folded or v.is_initializer() for v in inputs):
            folded.update(node.outputs)
            cheap.update(node.outputs)
        elif node.op_type in _SHAPE_OPS:
            cheap.update(node.outputs)
        elif all(v in cheap or v.is_initializer() for v in inputs):
            cheap.update(o for o in node.outputs if o.dtype not in _FLOATS)
    return cheap


def _cost_per_byte(value: ir.Value) -> float:
    """Operations to recompute ``value`` per byte of storing it (its producer alone)."""
    node = value.producer()
    size = _static_bytes(value)
    if node is None or not size:
        return 0.0
    per_element = 1.0
    if node.op_type in _CONTRACTIONS and len(node.inputs) > 1 and node.inputs[1] is not None:
        weight = node.inputs[1].shape
        if weight is not None and weight.is_static() and weight.rank() >= 1:
            dims = [int(d) for d in weight.numpy()]
            # MatMul/Gemm: the contracted dimension; Conv: C_in/group x kernel.
            per_element = float(math.prod(dims[1:]) if node.op_type.startswith("Conv") else dims[0])
    return per_element / value.dtype.itemsize if value.dtype else 0.0


@dataclasses.dataclass
class _Use:
    reader: ir.Node  # the main-graph node whose position orders the use
    holder: ir.Node | ir.Graph  # the node (or subgraph, for its outputs) holding the reference
    index: int
    value: ir.Value


def _uses(backward: Sequence[ir.Node], forward_values: set[ir.Value]) -> list[_Use]:
    uses: list[_Use] = []
    for node in backward:
        for i, v in enumerate(node.inputs):
            if v is not None and v in forward_values:
                uses.append(_Use(node, node, i, v))
        for body in graph_attributes(node):
            for g in (body, *body.subgraphs()):
                for inner in g:
                    for i, v in enumerate(inner.inputs):
                        if v is not None and v in forward_values:
                            uses.append(_Use(node, inner, i, v))
                for i, v in enumerate(g.outputs):
                    if v in forward_values:
                        uses.append(_Use(node, g, i, v))
    return uses


def _pinned(graph: ir.Graph, forward: Sequence[ir.Node]) -> set[ir.Value]:
    produced = {o for n in forward for o in n.outputs}
    pinned: set[ir.Value] = {v for v in graph.outputs if v in produced}
    for node in forward:
        if graph_attributes(node) or node.op_type in _RANDOM:
            pinned.update(node.outputs)
        pinned.update(o for o in node.outputs if not _is_tensor(o))
    return pinned


def _kept_by_budget(
    forward: Sequence[ir.Node], cheap: set[ir.Value], pinned: set[ir.Value], budget: int
) -> set[ir.Value]:
    """The most expensive-to-recompute values per byte that fit in ``budget`` (greedy)."""
    left = budget - sum(_static_bytes(v) or 0 for v in pinned)
    candidates = [
        (o, size)
        for n in forward
        for o in n.outputs
        if o not in cheap and o not in pinned and _is_tensor(o)
        for size in [_static_bytes(o)]
        if size  # a dynamic size cannot be charged to a budget: recomputed
    ]
    # Ties: the later value first (the reverse sweep needs it first, so storing it costs the
    # least time alive).
    order = {o: i for i, (o, _) in enumerate(candidates)}
    candidates.sort(key=lambda c: (-_cost_per_byte(c[0]), -order[c[0]]))
    kept: set[ir.Value] = set()
    for value, size in candidates:
        if size <= left:
            kept.add(value)
            left -= size
    return kept


# ------------------------------------------------------------------------ rewriting
@dataclasses.dataclass
class _Segment:
    """The clones sharing one gate, inserted before the first backward node reading them."""

    anchor: ir.Node
    cond: ir.Value | None
    clones: dict[ir.Value, ir.Value] = dataclasses.field(default_factory=dict)
    gated: dict[ir.Value, ir.Value] = dataclasses.field(default_factory=dict)
    nodes: list[ir.Node] = dataclasses.field(default_factory=list)


def _copy_attr(attr: ir.Attr) -> ir.Attr:
    if attr.type == ir.AttributeType.TENSOR:
        tensor = attr.as_tensor()
        return ir.AttrTensor(attr.name, ir.tensor(tensor.numpy()), attr.doc_string)
    return ir.Attr(attr.name, attr.type, attr.value, doc_string=attr.doc_string)


def _gate_condition(em: Emitter, gate: ir.Value) -> ir.Value:
    """A boolean scalar computed from one element of ``gate`` (the reverse sweep's value).

    ``ReduceSum`` of the first element (or of none, an empty tensor) keeps the cost constant
    and the result defined whatever the gate's size.
    """
    flat = em.op("Reshape", [gate, em.ints([-1])])
    first = em.op("Slice", [flat, em.ints([0]), em.ints([1])])
    return em.op("IsNaN", [em.reduce("ReduceSum", first, None, keepdims=False)])


class _Rewriter:
    def __init__(self, opset: int, forward_values: set[ir.Value], stored: set[ir.Value]) -> None:
        self.em = Emitter(opset)
        self.forward_values = forward_values
        self.stored = stored
        self.recomputed = 0

    def value(self, segment: _Segment, value: ir.Value) -> ir.Value:
        """The clone of ``value`` in ``segment``, built from stored values (iteratively)."""
        stack = [value]
        while stack:
            v = stack[-1]
            if self._is_stored(v) or v in segment.clones:
                stack.pop()
                continue
            node = v.producer()
            assert node is not None
            missing = [
                i
                for i in node.inputs
                if i is not None and not self._is_stored(i) and i not in segment.clones
            ]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            self._clone(segment, node)
        return value if self._is_stored(value) else segment.clones[value]

    def _is_stored(self, v: ir.Value) -> bool:
        return v not in self.forward_values or v in self.stored

    def _clone(self, segment: _Segment, node: ir.Node) -> None:
        inputs: list[ir.Value | None] = [
            None if i is None else segment.clones.get(i, i) for i in node.inputs
        ]
        if segment.cond is not None and not any(
            i is not None and i in segment.clones for i in node.inputs
        ):
            # Reads only stored values: gate one so the clone is a node of its own. An
            # activation rather than a weight: a weight stays an initializer, so onnxruntime's
            # rewrites that want constant weights (prepacking, Conv+BatchNormalization folding,
            # bias fusions) still apply to the clone; the smallest among equals.
            present = [k for k, i in enumerate(inputs) if i is not None and i.dtype in _WHERE_TYPES]
            if present:
                k = min(present, key=lambda j: _gate_cost(inputs[j]))  # type: ignore[arg-type]
                inputs[k] = self._gated(segment, inputs[k])  # type: ignore[arg-type]
        clone = ir.Node(
            node.domain,
            node.op_type,
            inputs,
            attributes=[_copy_attr(a) for a in node.attributes.values()],
            num_outputs=len(node.outputs),
            version=node.version,
        )
        for original, copy in zip(node.outputs, clone.outputs, strict=True):
            copy.type = ir.TensorType(original.dtype) if original.dtype is not None else None
            copy.shape = original.shape.copy() if original.shape is not None else None
            segment.clones[original] = copy
        segment.nodes.append(clone)
        self.recomputed += 1

    def _gated(self, segment: _Segment, value: ir.Value) -> ir.Value:
        gated = segment.gated.get(value)
        if gated is None:
            assert segment.cond is not None
            gated = self.em.op("Where", [segment.cond, value, value])
            gated.type = ir.TensorType(value.dtype) if value.dtype is not None else None
            gated.shape = value.shape.copy() if value.shape is not None else None
            segment.nodes.extend(self.em.take())
            segment.gated[value] = gated
        return gated


def _gate_cost(value: ir.Value) -> tuple[bool, int]:
    return (value.is_initializer(), _static_bytes(value) or 1 << 62)


def _replace(use: _Use, new: ir.Value) -> None:
    if isinstance(use.holder, ir.Graph):
        use.holder.outputs[use.index] = new
    else:
        use.holder.replace_input_with(use.index, new)


def rematerialize(
    model: ir.Model, seeds: Sequence[ir.Value], policy: RematPolicy, first_gate: ir.Value
) -> RematStats:
    """Makes the reverse sweep of ``model`` read recomputed copies of unstored residuals.

    Args:
        model: The model after linearize + transpose (changed in place).
        seeds: The cotangent seeds (``vjp``'s ``adj_`` inputs, ``grad``'s implicit 1): the
            main-graph nodes that depend on them are the reverse sweep, every other node is
            the forward sweep (the primal nodes, the primal-only helpers of the jvp rules).
        policy: The checked ``remat=`` policy; ``"store"`` changes nothing.
        first_gate: The gate of the residuals read before the sweep has computed anything that
            is not a constant: a seed input (``vjp``) or the loss (``grad``, whose seed is a
            constant): their recomputation runs after the forward sweep.

    Returns:
        What was kept and recomputed.
    """
    stats = RematStats()
    if policy.kind == "store":
        return stats
    # The rules build nodes without types; gates and sizes need them.
    infer_shapes(model)
    graph = model.graph
    sort(graph)
    order = list(graph)
    swept, constant = _sweep(order, seeds)
    forward = [n for n in order if n not in swept]
    backward = [n for n in order if n in swept]
    if not forward or not backward:
        return stats
    forward_values = {o for n in forward for o in n.outputs}
    cheap = _cheap(forward)
    pinned = _pinned(graph, forward)
    residual_values = forward_values - cheap
    uses = _uses(backward, residual_values)
    residuals = {u.value for u in uses}
    stats.residual_bytes = sum(_static_bytes(v) or 0 for v in residuals)
    if policy.kind == "recompute":
        kept = set(pinned)
    elif policy.kind == "ops":
        kept = pinned | {o for n in forward if n.op_type in policy.ops for o in n.outputs}
    else:
        kept = pinned | _kept_by_budget(forward, cheap, pinned, policy.budget)
    stats.kept_bytes = sum(_static_bytes(v) or 0 for v in residuals & kept)
    rewriter = _Rewriter(model.opset_imports[""], residual_values, kept | cheap)
    where_forward = {n: i for i, n in enumerate(forward)}
    n_segments = max(1, round(math.sqrt(len(forward))))
    position = {n: i for i, n in enumerate(order)}
    gates = _gates(order, swept, constant, first_gate)
    by_gate: dict[ir.Value | None, _Segment] = {}
    by_index: dict[int, _Segment] = {}
    for use in sorted(uses, key=lambda u: position[u.reader]):
        if use.value in kept:
            continue
        producer = use.value.producer()
        assert producer is not None
        index = where_forward[producer] * n_segments // len(forward)
        segment = by_index.get(index)
        if segment is None:
            gate = gates[position[use.reader]]
            segment = by_gate.get(gate)
            if segment is None:
                em = rewriter.em
                cond = _gate_condition(em, gate) if gate is not None else None
                segment = _Segment(use.reader, cond, nodes=em.take())
                by_gate[gate] = segment
            by_index[index] = segment
        _replace(use, rewriter.value(segment, use.value))
    for segment in by_gate.values():
        if segment.nodes:
            graph.insert_before(segment.anchor, segment.nodes)
    stats.recomputed = rewriter.recomputed
    stats.segments = len(by_gate)
    return stats


def _sweep(
    order: Sequence[ir.Node], seeds: Sequence[ir.Value]
) -> tuple[set[ir.Node], set[ir.Value]]:
    """The nodes depending on the seeds, and those of their values made of constants only.

    A value of the sweep computed from the seed of ``grad`` (a constant 1) and other constants
    only is folded into a constant by onnxruntime, so it cannot order anything: it is no gate.
    """
    values: set[ir.Value] = set(seeds)
    constant: set[ir.Value] = {s for s in seeds if s.producer() is not None}
    nodes: set[ir.Node] = set()
    for node in order:
        reads = [v for v in (*node.inputs, *subgraph_reads(node)) if v is not None]
        if not any(v in values for v in reads):
            continue
        nodes.add(node)
        values.update(node.outputs)
        if all(v in constant or v.is_initializer() or _is_constant(v) for v in reads):
            constant.update(node.outputs)
    return nodes, constant


def _is_constant(value: ir.Value) -> bool:
    node = value.producer()
    return node is not None and node.op_type in ("Constant", *_SHAPE_OPS)


def _gates(
    order: Sequence[ir.Node], swept: set[ir.Node], constant: set[ir.Value], first: ir.Value
) -> list[ir.Value | None]:
    """Per position, the last floating-point value of the sweep computed before it."""
    gates: list[ir.Value | None] = []
    last: ir.Value | None = first if first.dtype in _FLOATS else None
    for node in order:
        gates.append(last)
        if node not in swept:
            continue
        for out in node.outputs:
            if out.dtype in _FLOATS and _is_tensor(out) and out not in constant:
                last = out
    return gates
