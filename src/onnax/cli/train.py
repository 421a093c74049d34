"""``onnax train-step MODEL OUT/``: a training step in plain ONNX (see :mod:`onnax.training`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Adds ``train-step``, whose parser and work live with the training package."""
    from onnax.training import cli as training_cli

    training_cli.add_parser(sub, parents=[common])
