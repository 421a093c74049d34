"""bench_training.py's memory figures: the peak activations of a run, and the outputs' bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir

# The peak of the resident set during one run, above the resident set before it, is the run's
# peak working memory (activations, residuals, outputs), without the transient peaks of loading
# and optimizing the model that ru_maxrss would include: the kernel's high-water mark (VmHWM)
# is reset (/proc/self/clear_refs) after a first run, then read after the second. The arena is
# off, so that freed tensors leave the resident set and the mark is the peak of the tensors
# alive at once: the arena grows in regions of twice the size, and resnet18's gradient at batch
# 8 measured 446 MiB with it against 386 MiB of tensors without. glibc's malloc gets a fixed
# mmap threshold (MALLOC_MMAP_THRESHOLD_): by default it raises the threshold to the size of
# each mapped block freed, up to 32 MiB, after which freed tensors stay in its heap, the first
# run's peak stays resident and the second run's mark shows nothing (resnet18's gradient at
# batch 1: 9 MiB, against 67 MiB with the threshold fixed). Where the mark cannot be reset,
# the growth of the resident set over the runs with the arena on (and the memory pattern off:
# with it the first run's tensors and the second run's planned block both stay) is the figure.
# Each run's outputs are dropped at once: they come back as copies, and a 256 MiB output kept
# measured 528 MiB, dropped 264.
_MEMORY_CHILD = """
import sys, numpy as np, onnxruntime as ort
def status(key):
    with open("/proc/self/status") as status:
        line = next(l for l in status if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024
def session(arena):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_mem_pattern = False
    options.enable_cpu_mem_arena = arena
    return ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
feeds = dict(np.load(sys.argv[2]))
try:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    resettable = True
except OSError:
    resettable = False
sess = session(arena=not resettable)
if resettable:
    sess.run(None, feeds)
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    sess.run(None, feeds)
    print(status("VmHWM") - before)
else:
    before = status("VmRSS")
    for _ in range(2):
        sess.run(None, feeds)
    print(status("VmRSS") - before)
"""


def peak_memory(model: ir.Model, feeds: dict[str, np.ndarray], scratch: Path) -> int:
    """Peak bytes above the resident set before a run of the model (a fresh process; see above).

    ``feeds`` holds every input of the model.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    model_path, feeds_path = scratch / "memory.onnx", scratch / "memory.npz"
    ir.save(model, model_path)
    np.savez(feeds_path, **feeds)  # type: ignore[arg-type]
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(model_path), str(feeds_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)},
    )
    return int(out.stdout.strip().splitlines()[-1])


def output_bytes(model: ir.Model) -> int:
    """The bytes of the graph outputs whose shapes and types are static."""
    total = 0
    for value in model.graph.outputs:
        shape, dtype = value.shape, value.dtype
        if shape is None or dtype is None or not all(isinstance(d, int) for d in shape.dims):
            continue
        total += int(np.prod([int(d) for d in shape.dims]) * dtype.itemsize)
    return total
