"""The numerical check of a derived model: ``onnax.check(model, derived)``.

Behind the command line's ``--check``, usable from Python too: it returns a structured
:class:`CheckResult` whose rows say ``ok``, ``wrong`` or ``inconclusive``.
"""

from onnax.checking.compare import TRANSFORMS, check, infer_transform
from onnax.checking.result import CheckResult, Outcome, Row

__all__ = ["TRANSFORMS", "CheckResult", "Outcome", "Row", "check", "infer_transform"]
