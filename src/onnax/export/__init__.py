"""Export to other tools: CasADi derivative families, their seed layout and contract.

:mod:`onnax.export.casadi` is public as :mod:`onnax.casadi`.
"""
