"""Every light-zoo check, the pairs the unit tests leave out included.

    uv run python tests/benchmarks/zoo_sweep.py [model ...] [--check grad_jvp|jvp_of_grad|vmap_of_grad]

``tests/test_zoo.py`` checks grad and jvp (against float64 central differences of the model's
twin), jvp(grad) and vmap(grad) of the nine light-zoo models; its default run keeps only the
first-order check of alexnet and zfnet512 and nothing of vgg19 (``test_zoo.SLOW``: a minute or
more per check). This runs every (model, check) pair, by default all of them, with the unit
tests' own checks and tolerances. Prints one line per pair and exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import test_zoo


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("models", nargs="*", help="light-zoo models (default: all nine)")
    parser.add_argument("--check", action="append", choices=list(test_zoo.CHECKS))
    args = parser.parse_args(argv)
    pairs = [
        (n, c)
        for n, c in test_zoo.cases(every=True)
        if (not args.models or n in args.models) and (not args.check or c in args.check)
    ]
    failed = 0
    for name, check in pairs:
        start = time.perf_counter()
        try:
            test_zoo.CHECKS[check](name)
            status = "ok"
        except Exception as err:
            failed += 1
            status = "FAIL " + "".join(traceback.format_exception_only(err)).strip()
        print(f"{name:14} {check:13} {time.perf_counter() - start:6.1f} s  {status}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
