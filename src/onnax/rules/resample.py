"""Rules: see the module list in onnax.rules (being written)."""
