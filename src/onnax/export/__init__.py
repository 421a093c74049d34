"""Export helpers behind :mod:`onnax.casadi`: the seed layout and the CasADi contract."""
