"""runtime layer of W12 (see ../SPEC.md and the project README)."""
