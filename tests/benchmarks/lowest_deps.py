"""Installs onnax with the lowest dependency versions it allows and runs the demo and a test sample.

The floors are read from ``pyproject.toml`` (``name>=X`` becomes ``name==X``), so a floor that no
longer works fails CI instead of a user's install. A throwaway virtual environment keeps the
project's own ``.venv`` untouched.

    uv run python tests/benchmarks/lowest_deps.py                      # the declared floors
    uv run python tests/benchmarks/lowest_deps.py --python python3.13  # on another interpreter
    uv run python tests/benchmarks/lowest_deps.py --pin onnxruntime==1.24.1   # try another floor
    uv run python tests/benchmarks/lowest_deps.py --tests none         # the demo only
    uv run python tests/benchmarks/lowest_deps.py --latest --python python3.13  # newest versions
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = [
    "tests/test_cli.py",
    "tests/test_check.py",
    "tests/test_diagnostics.py",
    "tests/test_compositions.py",
    "tests/test_unroll.py",
]
"""Fast tests that between them touch every transform, the check and the unroll pass."""

TEST_TOOLS = ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6"]


def floors(pyproject: Path) -> dict[str, str]:
    """``{name: lowest version}`` of every runtime dependency declared with ``>=``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    out: dict[str, str] = {}
    for spec in project["dependencies"]:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([^,;\s]+).*", spec)
        if match is None:
            raise SystemExit(f"lowest_deps: {spec!r} has no '>=' floor; give every dependency one")
        out[match.group(1).lower()] = match.group(2)
    return out


def run(cmd: list[str], cwd: Path | None = None) -> None:
    """Runs ``cmd``, echoing it; stops the script on failure with the command's status."""
    print("+", " ".join(cmd), flush=True)
    status = subprocess.run(cmd, cwd=cwd, check=False).returncode
    if status != 0:
        raise SystemExit(status)


def main(argv: list[str] | None = None) -> int:
    """Builds the environment, runs ``onnax demo`` and the sample; returns 0 when all pass."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter of the venv")
    parser.add_argument("--pin", action="append", default=[], help="NAME==VERSION override")
    parser.add_argument(
        "--tests", default=",".join(SAMPLE), help="comma-separated test paths, or 'none'"
    )
    parser.add_argument(
        "--latest", action="store_true", help="the newest allowed versions instead of the floors"
    )
    args = parser.parse_args(argv)
    pins = {} if args.latest else floors(ROOT / "pyproject.toml")
    for item in args.pin:
        name, _, version = item.partition("==")
        pins[name.lower()] = version
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("lowest_deps: needs uv on PATH (pip install uv)")
    with tempfile.TemporaryDirectory(prefix="onnax-lowest-") as tmp:
        venv = Path(tmp) / "venv"
        python = str(venv / "bin" / "python")
        run([uv, "venv", "--quiet", "--python", args.python, str(venv)])
        # The source is copied so that the installed package is not the work tree being edited.
        src = Path(tmp) / "onnax"
        shutil.copytree(
            ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "dist", "generated")
        )
        # A --pin below a declared floor lowers the copy's floor, so it can be tried at all.
        pyproject = src / "pyproject.toml"
        text = pyproject.read_text()
        for name, version in pins.items():
            text = re.sub(
                rf'"{re.escape(name)}>=[^"]*"', f'"{name}>={version}"', text, flags=re.IGNORECASE
            )
        pyproject.write_text(text)
        run(
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                python,
                str(src),
                *(f"{n}=={v}" for n, v in sorted(pins.items())),
                *TEST_TOOLS,
            ]
        )
        run([uv, "pip", "list", "--python", python])
        run([str(venv / "bin" / "onnax"), "demo"], cwd=Path(tmp))
        if args.tests != "none":
            tests = [str(src / t) for t in args.tests.split(",") if t]
            run(
                [python, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
                cwd=src,
            )
    print("lowest_deps: OK", " ".join(f"{n}=={v}" for n, v in sorted(pins.items())) or "(latest)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
