"""bench_training.py's handle on a PyTorch process that times the same networks on request.

The worker is ``training_torch.py --serve`` run by the torch venv's Python (see its
``serve()``): it builds a network as the export did (or converts an ONNX file with onnx2torch),
runs each computation once, then times one computation per request. bench_training.py asks for
one PyTorch run after each onnxruntime run of a round, so both sides' medians come from the same
minutes of a shared machine: a ratio between them is a side-by-side measurement, not one against
timings taken at export, when the machine may have been quieter or busier.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from types import TracebackType

HERE = Path(__file__).resolve().parent


class TorchWorker:
    """A ``training_torch.py --serve`` process; one network loaded at a time."""

    def __init__(self, python: str) -> None:
        self._process = subprocess.Popen(
            [python, str(HERE / "training_torch.py"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.cases: list[str] = []
        self.saved_bytes = 0
        self.loss = math.nan

    def _ask(self, request: dict[str, object]) -> dict[str, object]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(
                f"the PyTorch worker stopped (exit {self._process.wait()}); its error is above"
            )
        answer: dict[str, object] = json.loads(line)
        return answer

    def load(self, spec: dict[str, object]) -> None:
        """Builds the network ``spec`` names (see ``training_torch.serve``) and warms it up."""
        answer = self._ask({"load": spec})
        self.cases = list(answer["cases"])  # type: ignore[call-overload]
        self.saved_bytes = int(answer["saved_bytes"])  # type: ignore[call-overload]
        self.loss = float(answer["loss"])  # type: ignore[arg-type]

    def time(self, case: str) -> float:
        """Seconds of one run of ``case`` (one of :attr:`cases`)."""
        return float(self._ask({"time": case})["seconds"])  # type: ignore[arg-type]

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait()

    def __enter__(self) -> TorchWorker:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
