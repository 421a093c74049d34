"""Former name of the node-test corpus driver, kept as an alias of ``coverage.py``.

``uv run python tests/benchmarks/node_corpus.py ...`` runs ``tests/benchmarks/coverage.py`` with
the same arguments. There is one driver; this file only forwards to it (loaded by path, under the
module name ``onnax_node_coverage``, because ``coverage`` is also the name of a common package).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load() -> object:
    """The driver module ``tests/benchmarks/coverage.py``."""
    name = "onnax_node_coverage"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("coverage.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(load().main())  # type: ignore[attr-defined]
