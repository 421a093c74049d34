"""The batch-B light-zoo CNNs that bench_training.py's ``--zoo`` times (training_zoo.py).

The batch sizes above 1 are made by rewriting the Reshape targets that the batch-1 export wrote
the batch into; a wrong rewrite would make the benchmark time a different network. The oracle:
each example of the batch-2 model's output equals the batch-1 model's output on that example.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from oracles import run

BENCH = Path(__file__).parent / "benchmarks" / "training_zoo.py"


def _training_zoo():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("training_zoo", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["training_zoo"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["shufflenet", "squeezenet"])
def test_batch_two_is_the_batch_one_network_per_example(name: str) -> None:
    tz = _training_zoo()
    single, _ = tz.zoo_primal(name, 1)
    double, x = tz.zoo_primal(name, 2)
    assert x.shape[0] == 2
    assert [v.name for v in double.graph.inputs] == ["x"]
    assert [v.name for v in double.graph.outputs] == ["y", "loss"]
    y = run(double, {"x": x})["y"]
    for i in range(2):
        np.testing.assert_allclose(y[i : i + 1], run(single, {"x": x[i : i + 1]})["y"], rtol=1e-5)
