"""Packaging metadata: what pip shows and what a type checker and a shell find."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import onnax
from onnax.core.opsets import MAX_OPSET, MIN_OPSET

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_metadata() -> None:
    classifiers = PROJECT["classifiers"]
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    # PEP 639: the license expression, not also a License classifier.
    assert PROJECT["license"] == "MIT"
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert PROJECT["urls"]
    summary = PROJECT["description"]
    assert "vmap" in summary and "Jacobian" in summary and "Hessian" in summary
    for word in ("vmap", "Jacobians", "Hessians"):
        assert word in (onnax.__doc__ or "")


def test_version_agrees_and_py_typed_ships() -> None:
    assert onnax.__version__ == PROJECT["version"] == version("onnax")
    assert (Path(onnax.__file__).parent / "py.typed").is_file()


def test_the_opset_wording_holds_for_the_installed_onnx() -> None:
    """README says "Opsets 11 to 28": true only with onnx >= 1.23, the declared floor."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"Opsets (\d+) to (\d+)", readme)
    assert match is not None
    assert (int(match.group(1)), int(match.group(2))) == (MIN_OPSET, 28)
    assert MAX_OPSET >= 28
    floors = dict(re.match(r"([\w-]+)>=(.+)", d).groups() for d in PROJECT["dependencies"])  # type: ignore[union-attr]
    assert tuple(int(p) for p in floors["onnx"].split(".")[:2]) >= (1, 23)
