"""Zoo derivatives at every onnxruntime optimization level, the models too slow for the unit tests.

    uv run python tests/benchmarks/zoo_levels.py [model ...]

Runs ``tests/test_ort_levels.py``'s checks (grad and vmap(grad) at ORT_DISABLE_ALL, BASIC,
EXTENDED and ALL, each against the float64 twin pinned to that run's own ReLU masks and max-pool
selections) on the given light-zoo models, by default the unit tests' models and the slower
resnet50 and densenet121. Prints one line per model and exits 1 if any check fails.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import test_ort_levels as levels


def main(argv: list[str]) -> int:
    names = argv or [*levels.MODELS, *levels.MORE_MODELS]
    failed = 0
    for name in names:
        start = time.perf_counter()
        try:
            levels.check_grad_at_every_level(name)
            levels.check_vmap_of_grad_at_every_level(name)
            status = "ok"
        except Exception as err:
            failed += 1
            status = "FAIL " + "".join(traceback.format_exception_only(err)).strip()
        print(f"{name:14} {time.perf_counter() - start:6.1f} s  {status}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
