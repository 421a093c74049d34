"""Control flow: If, Loop and Scan in forward mode, reverse mode and vmap.

One module per operator (:mod:`.if_`, :mod:`.scan`, :mod:`.loop`), each holding the operator's
jvp, transpose and batch rules; :mod:`._common` holds the machinery the jvp and transpose rules
share, :mod:`._batching` that of the batch rules.

The jvp and transpose rules work on whole subgraphs through the hooks of a
:class:`~onnax.core.subgraphs.ScopedEmitter` (the walks of the passes), in one of two modes:

* **forward** (jvp): the node is replaced by one node of the same operator whose body computes
  primal and tangent values together. Loops and Scans carry the tangents as extra state, scan
  inputs and scan outputs: nothing is stored, and any number of seeds works.
* **linearize** (reverse mode): the primal node stays. A Loop or Scan additionally records the
  state every iteration starts from (as extra scan outputs; the primal Loop is replaced by one
  that also counts its iterations in an extra state, so that vmap can batch the records of
  examples that stop at different iterations); a separate *linear* node reads the
  records, recomputes the body's primal part locally and computes the tangents, so that it is
  linear in the tangents. Its transpose rule builds the backward node: an If on the same
  condition, or a Loop/Scan running the iterations backwards (reading the records from the last
  one), recomputing the primal part and running the transposed body. The cotangent of an outer
  value read by a body (a captured weight) accumulates in the backward node's state, so its cost
  is O(|w|), not O(T·|w|).

A transpose rule returns the cotangents of its explicit inputs followed by those of the captured
linear values (:func:`~onnax.core.subgraphs.captured_linear`).

The batch rules batch the subgraphs by the pass's own walk (:meth:`Batcher.batch_body`), with
one map from original values to replacements shared by every graph: a body that reads a batched
value of an enclosing graph (implicit capture) reads its batched replacement, and nesting is
recursion. Bodies are batched on copies; the original node dies and its bodies are detached by
the pass.
"""
