"""Local rewrites that make a transformed model smaller without changing what it computes.

The rules emit what each operator needs on its own; chained together they leave
``Transpose(Transpose(x))``, ``Reshape(Reshape(x))``, ``Squeeze(Unsqueeze(x))``, Casts there and
back, Identities and run-time shape arithmetic on shapes that are known. :class:`SimplifyLocally`
removes those in one topological sweep per graph (a node is looked at after the nodes it reads,
so a whole chain collapses in one sweep), each rewrite looking only at a node and its producer:
the sweep is linear in the graph's size. :class:`~onnax.passes.cleanup.Cleanup` repeats it with
common-subexpression elimination until neither changes anything.

onnx_ir has ``IdentityEliminationPass`` but it may make one value two outputs of a Scan body
(that changed the numbers of LSTM and GRU derivatives) and it renames graph inputs' consumers
freely; it has no folding nor chain rewrites. So every rewrite here keeps each graph's outputs
distinct values with their declared names and types, and never forwards a graph input, an
initializer or a value of an enclosing graph to a subgraph output.

A rewrite changes the *consumer* in place (it reads further up the chain) and keeps its output
value, so the names, types and shapes already annotated stay true; producers left without uses
go with dead-code removal.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir
import onnx_ir.passes as passes

from onnax.core.fast_ir import detach_inputs
from onnax.core.fast_nodes import node_list
from onnax.core.inference import RANK_GUESSED
from onnax.core.static import attr_tensor, constant_of
from onnax.core.traverse import model_graphs
from onnax.passes.simplify_fold import MAX_FOLDED_ELEMENTS, fold_node, foldable
from onnax.passes.stop_gradient import STOP_MARK

__all__ = ["SimplifyLocally", "remove_unused"]


class SimplifyLocally(passes.InPlacePass):
    """One sweep of the local rewrites over every graph of the model, subgraphs included.

    Collapses Transpose, Reshape, Squeeze/Unsqueeze and exact Cast chains, removes Identity
    nodes and identity Transposes, Reshapes, Casts and Expands, and folds shape arithmetic on
    constants and static shapes (results of at most
    :data:`~onnax.passes.simplify_fold.MAX_FOLDED_ELEMENTS` elements).
    """

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the sweep on ``model``."""
        sweep = _Sweep(model.graph)
        modified = False
        for graph in model_graphs(model):
            modified = sweep.run(graph) or modified
            remove_unused(graph, sweep.dropped)
            sweep.dropped = []
        return passes.PassResult(model, modified=modified)


_DROPPED = "onnax.simplify_dropped"
"""``node.meta`` key of a node a rewrite removed (it leaves the graph at the end of the sweep)."""


def _dropped(node: ir.Node) -> bool:
    """Whether a rewrite removed ``node`` (``node.meta[_DROPPED]``).

    Read without ``node.meta``, which makes a store for every node it is read on: the sweep
    asks every node of a derivative model, and only the dropped ones have a store to read.
    """
    meta = node._metadata
    return meta is not None and bool(meta.get(_DROPPED))


class _Sweep:
    """The state of a sweep: the main graph and the constants already read."""

    def __init__(self, main: ir.Graph) -> None:
        self.main = main
        # Where inference guessed a rank (see RANK_GUESSED), annotated shapes may rest on the
        # guess: then no rewrite reads them.
        self.trusted = main.meta.get(RANK_GUESSED) is False
        self.dropped: list[ir.Node] = []
        self.known: dict[ir.Value, np.ndarray | None] = {}
        self.rules: dict[str, Callable[[ir.Node], bool]] = {
            "Identity": self.identity,
            "Transpose": self.transpose,
            "Reshape": self.reshape,
            "Unsqueeze": self.unsqueeze,
            "Squeeze": self.squeeze,
            "Cast": self.cast,
            "Flatten": self.same_shape,
            "Expand": self.same_shape,
        }

    def run(self, graph: ir.Graph) -> bool:
        modified = False
        for node in node_list(graph):
            if _dropped(node) or node.domain != "":
                continue  # removed by an earlier rewrite, or not an ONNX operator
            rule = self.rules.get(node.op_type)
            if rule is not None and rule(node):
                modified = True
                if _dropped(node):
                    continue
            if foldable(node) and self.fold(node):
                modified = True
        return modified

    def forward(self, node: ir.Node, x: ir.Value) -> bool:
        """:func:`_forward`, recording the node when it goes."""
        if not _forward(node, x):
            return False
        if _dropped(node):
            self.dropped.append(node)
        return True

    def drop(self, node: ir.Node) -> None:
        _detach(node)
        self.dropped.append(node)

    # -- reading the graph ------------------------------------------------------------------

    def constant(self, value: ir.Value | None) -> np.ndarray | None:
        """The content of a small constant (initializer or ``Constant``), else None.

        A main-graph initializer that is also an input is a default the caller may override:
        not a constant.
        """
        if value is None or value.is_graph_input():
            return None
        if value in self.known:
            return self.known[value]
        array: np.ndarray | None = None
        producer = value.producer()
        # Only Constant nodes. Inference may put a const_value on any value whose content it
        # propagated, from shapes that can rest on a guessed rank. And an initializer is a
        # parameter a later transform may differentiate (selections name initializers): a
        # folded Transpose(W) would have no tangent in jvp(grad(m), W).
        if producer is not None and producer.op_type == "Constant" and _small(value):
            array = constant_of(value)
        self.known[value] = array
        return array

    def ints(self, value: ir.Value | None) -> list[int] | None:
        array = self.constant(value)
        if array is None or array.dtype.kind not in "iu":
            return None
        return [int(a) for a in array.reshape(-1)]

    def static_dims(self, value: ir.Value | None) -> list[int] | None:
        """The value's static shape, where it holds every time the graph runs.

        The declared shape of a subgraph input (a Loop's carried value) need not hold in every
        iteration, so it is not used.
        """
        if not self.trusted or value is None or value.shape is None:
            return None
        if not value.shape.is_static():
            return None
        if value.is_graph_input() and value.graph is not self.main:
            return None
        return [int(d) for d in value.shape.numpy()]

    def rank(self, value: ir.Value | None) -> int | None:
        if not self.trusted or value is None or value.shape is None:
            return None
        return len(value.shape)

    def perm(self, node: ir.Node) -> list[int] | None:
        """A Transpose's permutation (reversing the axes when absent and the rank is known)."""
        attr = node.attributes.get("perm")
        if attr is not None:
            return [int(p) for p in attr.as_ints()]
        rank = self.rank(node.inputs[0])
        return None if rank is None else list(reversed(range(rank)))

    def axes(self, node: ir.Node) -> list[int] | None:
        """The constant ``axes`` of a Squeeze/Unsqueeze, input (opset 13+) or attribute."""
        if len(node.inputs) > 1:
            return self.ints(node.inputs[1])
        attr = node.attributes.get("axes")
        return None if attr is None else [int(a) for a in attr.as_ints()]

    # -- the rules ----------------------------------------------------------------------------

    def identity(self, node: ir.Node) -> bool:
        x = node.inputs[0] if node.inputs else None
        if STOP_MARK in node.metadata_props:
            return False  # it holds a stop_gradient name that later transforms may name again
        return x is not None and self.forward(node, x)

    def transpose(self, node: ir.Node) -> bool:
        perm = self.perm(node)
        if perm is None:
            return False
        changed = False
        up = _producer(node.inputs[0], "Transpose")
        inner = self.perm(up) if up is not None else None
        if up is not None and inner is not None and len(inner) == len(perm):
            # y[j] = t[perm[j]] = x[inner[perm[j]]]
            perm = [inner[p] for p in perm]
            node.replace_input_with(0, up.inputs[0])
            node.attributes["perm"] = ir.AttrInt64s("perm", perm)
            changed = True
        x = node.inputs[0]
        if x is not None and perm == list(range(len(perm))):
            return self.forward(node, x) or changed
        return changed

    def reshape(self, node: ir.Node) -> bool:
        target = self.ints(node.inputs[1]) if len(node.inputs) > 1 else None
        changed = False
        keeps_zeros = bool(node.attributes.get_int("allowzero", 0))
        if target is None or not (keeps_zeros or 0 not in target):
            return self.same_shape(node)
        # A reshape only reads its input's element count (but for 0 = "copy this dimension"),
        # which a reshape-like producer does not change: read past all of them (the value
        # reached may itself come from a Reshape that an earlier rewrite kept for its users).
        # A Transpose that moves only axes of size 1 keeps the elements' order: reshape-like
        # too (the depthwise Conv's input gradient regroups ``[C, 1, k]`` weights that way).
        while (
            up := _producer(node.inputs[0], "Reshape", "Flatten", "Squeeze", "Unsqueeze")
            or self.unit_transpose(node.inputs[0])
        ) is not None:
            node.replace_input_with(0, up.inputs[0])
            changed = True
        return self.same_shape(node) or changed

    def unit_transpose(self, value: ir.Value | None) -> ir.Node | None:
        """The Transpose computing ``value`` when it moves only axes of static size 1."""
        up = _producer(value, "Transpose")
        perm = self.perm(up) if up is not None else None
        dims = self.static_dims(up.inputs[0]) if up is not None else None
        if up is None or perm is None or dims is None or len(perm) != len(dims):
            return None
        moved = [p for p in perm if dims[p] != 1]
        return up if moved == sorted(moved) else None

    def same_shape(self, node: ir.Node) -> bool:
        """Removes a Reshape, Flatten, Squeeze, Unsqueeze or Expand that changes no shape."""
        x = node.inputs[0]
        before, after = self.static_dims(x), self.static_dims(node.outputs[0])
        if x is None or before is None or before != after:
            return False
        return self.forward(node, x)

    def unsqueeze(self, node: ir.Node) -> bool:
        axes = self.axes(node)
        up = _producer(node.inputs[0], "Unsqueeze", "Squeeze")
        if axes is None or up is None or up.inputs[0] is None:
            return self.same_shape(node)
        inner = self.axes(up)
        x = up.inputs[0]
        r = self.rank(x)
        if inner is None:
            return self.same_shape(node)
        if up.op_type == "Squeeze":
            # Squeeze(x, a) then Unsqueeze(a): both read their axes against x's rank r, the
            # rank is back to r and the dimensions removed were 1.
            if _same_axes(inner, axes, r):
                return self.forward(node, x)
            return self.same_shape(node)
        # Unsqueeze(Unsqueeze(x, inner), axes): one Unsqueeze inserting both sets of axes.
        if r is None and min(axes + inner) < 0:
            return self.same_shape(node)
        k = len(inner) + len(axes)
        outer = _normal(axes, r + k) if r is not None else sorted(axes)
        mid = _normal(inner, r + len(inner)) if r is not None else sorted(inner)
        if -1 in outer or -1 in mid or len(set(outer)) != len(outer):
            return False
        free = _free_positions(outer, (max(mid) + 1) if mid else 0)
        merged = sorted(set(outer) | {free[j] for j in mid})
        if len(merged) != k:
            return False
        _set_axes(node, merged)
        node.replace_input_with(0, x)
        return True

    def squeeze(self, node: ir.Node) -> bool:
        axes = self.axes(node)
        up = _producer(node.inputs[0], "Unsqueeze")
        if axes is None or up is None or up.inputs[0] is None:
            return self.same_shape(node)
        inner = self.axes(up)
        x = up.inputs[0]
        r = self.rank(x)
        if inner is None:
            return self.same_shape(node)
        # Unsqueeze(x, a) then Squeeze(a): both read their axes against the same rank.
        if _same_axes(inner, axes, r + len(inner) if r is not None else None):
            return self.forward(node, x)
        return self.same_shape(node)

    def cast(self, node: ir.Node) -> bool:
        to = ir.DataType(node.attributes.get_int("to", 0))
        x = node.inputs[0]
        changed = False
        up = _producer(x, "Cast")
        if up is not None and up.inputs[0] is not None and up.inputs[0].dtype is not None:
            src = up.inputs[0].dtype
            mid = ir.DataType(up.attributes.get_int("to", 0))
            if _cast_skippable(src, mid, to):
                node.replace_input_with(0, up.inputs[0])
                x = up.inputs[0]
                changed = True
        if x is not None and x.dtype is not None and x.dtype == to:
            return self.forward(node, x) or changed
        return changed

    # -- folding ------------------------------------------------------------------------------

    def fold(self, node: ir.Node) -> bool:
        out = node.outputs[0]
        if out.is_graph_output():
            return False  # a graph output keeps its producer (and its name and type)
        if node.op_type in ("Shape", "Size"):
            x = node.inputs[0]
            if self.static_dims(x) is None:
                return False
            args: list[np.ndarray | None] = [None]
        else:
            args = [self.constant(v) for v in node.inputs]
            if any(a is None for a, v in zip(args, node.inputs, strict=True) if v is not None):
                return False
        result = fold_node(node, args)
        if result is None:
            return False
        graph = node.graph
        assert graph is not None
        const = _constant(result)
        new = const.outputs[0]
        new.name = out.name
        new.type = ir.TensorType(ir.DataType.from_numpy(result.dtype))
        new.shape = ir.Shape(list(result.shape))
        graph.insert_before(node, const)
        out.replace_all_uses_with(new)
        self.drop(node)
        self.known[new] = result
        return True


def _constant(array: np.ndarray) -> ir.Node:
    """A Constant node holding ``array`` (built directly: ``ir.node`` checks types slowly)."""
    return ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.Tensor(array))], num_outputs=1)


def _small(value: ir.Value, limit: int = MAX_FOLDED_ELEMENTS) -> bool:
    """Whether a Constant is small enough to read (reading a big one would cost its size)."""
    if value.const_value is not None:
        return value.const_value.size <= limit
    node = value.producer()
    if node is None or node.op_type != "Constant" or node.domain != "":
        return False
    attr = node.attributes.get("value")
    return attr is None or attr.is_ref() or attr_tensor(attr).size <= limit


def _producer(value: ir.Value | None, *ops: str) -> ir.Node | None:
    """The node computing ``value`` when it is one of ``ops`` with a single output."""
    node = value.producer() if value is not None else None
    if node is None or node.domain != "" or node.op_type not in ops or len(node.outputs) != 1:
        return None
    if not node.inputs or node.inputs[0] is None:
        return None
    return node


def _normal(axes: list[int], rank: int) -> list[int]:
    return sorted(a % rank for a in axes) if all(-rank <= a < rank for a in axes) else [-1]


def _same_axes(first: list[int], second: list[int], rank: int | None) -> bool:
    """Whether two axes lists, read against the same rank, name the same distinct axes."""
    if rank is not None:
        a, b = _normal(first, rank), _normal(second, rank)
        return a == b and -1 not in a and len(set(a)) == len(a)
    return sorted(first) == sorted(second) and len(set(first)) == len(first)


def _free_positions(taken: list[int], count: int) -> list[int]:
    """The first ``count`` positions that are not in ``taken``."""
    skip, free, i = set(taken), list[int](), 0
    while len(free) < count:
        if i not in skip:
            free.append(i)
        i += 1
    return free


def _set_axes(node: ir.Node, axes: list[int]) -> None:
    if len(node.inputs) > 1:
        const = _constant(np.array(axes, np.int64))
        const.outputs[0].name = f"{node.outputs[0].name or 'unsqueeze'}_axes"
        const.outputs[0].type = ir.TensorType(ir.DataType.INT64)
        const.outputs[0].shape = ir.Shape([len(axes)])
        graph = node.graph
        assert graph is not None
        graph.insert_before(node, const)
        node.replace_input_with(1, const.outputs[0])
    else:
        node.attributes["axes"] = ir.AttrInt64s("axes", axes)


_FLOATS = frozenset(
    {ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE}
)
_SIGNED = (ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64)
_UNSIGNED = (ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64)
_MANTISSA = {
    ir.DataType.BFLOAT16: 8,
    ir.DataType.FLOAT16: 11,
    ir.DataType.FLOAT: 24,
    ir.DataType.DOUBLE: 53,
}
_FLOAT_ORDER = {ir.DataType.FLOAT16: 1, ir.DataType.FLOAT: 2, ir.DataType.DOUBLE: 3}


def _exact(src: ir.DataType, dst: ir.DataType) -> bool:
    """Whether ``Cast`` from ``src`` to ``dst`` is exact for every value of ``src``."""
    if src == dst or src == ir.DataType.BOOL:
        return src == dst or dst in _FLOATS or dst in _SIGNED or dst in _UNSIGNED
    if src in _FLOATS and dst in _FLOATS:
        if src == ir.DataType.BFLOAT16:
            return dst in (ir.DataType.FLOAT, ir.DataType.DOUBLE)
        return dst != ir.DataType.BFLOAT16 and _FLOAT_ORDER[src] < _FLOAT_ORDER[dst]
    bits = {t: 8 << i for i, t in enumerate(_SIGNED)} | {t: 8 << i for i, t in enumerate(_UNSIGNED)}
    if src not in bits:
        return False
    signed, width = src in _SIGNED, bits[src]
    if dst in _FLOATS:
        return width - signed <= _MANTISSA[dst]
    if dst not in bits:
        return False
    if dst in _SIGNED:
        return bits[dst] > width or (signed and bits[dst] == width)
    return not signed and bits[dst] >= width


def _cast_skippable(src: ir.DataType, mid: ir.DataType, dst: ir.DataType) -> bool:
    """Whether ``Cast(Cast(x: src, mid), dst)`` equals ``Cast(x, dst)`` for every x.

    The first cast must be exact; widening then narrowing back is then the identity, and
    narrowing then widening (which rounds) never qualifies. An integer passed through a float
    and cast to an integer type that does not hold every value of ``src`` is excluded too:
    the direct cast wraps around where a float's conversion is the runtime's business.
    """
    if not _exact(src, mid):
        return False
    if src == ir.DataType.BOOL or mid not in _FLOATS or src in _FLOATS:
        return True
    return dst in _FLOATS or dst == ir.DataType.BOOL or dst == src or _exact(src, dst)


def _forward(node: ir.Node, x: ir.Value) -> bool:
    """Makes ``node``'s consumers read ``x`` instead of its (single) output.

    A graph output keeps its name and declared type: ``x`` takes them when it is a value of the
    same graph that no other output holds; otherwise (a graph input, an initializer, an outer
    value or another output) the node becomes ``Identity(x)``, so each output stays its own value.
    """
    out = node.outputs[0]
    graph = node.graph
    assert graph is not None
    if out.is_graph_output():
        producer = x.producer()
        movable = (
            producer is not None
            and producer.graph is graph
            and not x.is_graph_output()
            and not x.is_initializer()
            and (x.type is None or out.type is None or x.type == out.type)
        )
        if not movable:
            if node.op_type == "Identity":
                return False
            node.op_type = "Identity"
            node.attributes.clear()
            node.replace_input_with(0, x)
            node.resize_inputs(1)
            return True
        name, type_, shape = out.name, out.type, out.shape
        out.replace_all_uses_with(x, replace_graph_outputs=True)
        out.name = None
        x.name = name
        if type_ is not None:
            x.type = type_
        x.shape = ir.Shape(shape) if shape is not None else None
    else:
        out.replace_all_uses_with(x)
    _detach(node)
    return True


def _detach(node: ir.Node) -> None:
    """Makes a node about to be removed stop using its inputs (and marks it removed)."""
    detach_inputs(node)
    node.meta[_DROPPED] = True


def remove_unused(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    """Removes nodes whose outputs nothing uses any more, all in one call.

    ``graph.remove`` makes a set of the graph's outputs on every call, a list that grows with
    the model (a gradient w.r.t. every weight has thousands): removing nodes one call at a
    time is quadratic. The callers know the outputs are unused and no graph output; the nodes
    only have to stop using their inputs.
    """
    for node in nodes:
        _detach(node)
    if nodes:
        graph.remove(nodes)
