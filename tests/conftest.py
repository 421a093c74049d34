import sys
from importlib.util import find_spec
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_report_header() -> str:
    """Says whether the CasADi tests run: they skip without the ``casadi`` extra."""
    if find_spec("casadi") is None:
        return "casadi: not installed, tests/test_casadi.py skips (uv sync --extra casadi)"
    from importlib.metadata import version

    return f"casadi: {version('casadi')}, tests/test_casadi.py runs"
