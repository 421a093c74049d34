"""Core machinery shared by every transform: registry, emitter, shapes, naming, selection."""
