import importlib.util
import os
from pathlib import Path

import pytest

# Triton kernels run on the CPU through the interpreter in tests. Triton reads this when @triton.jit
# decorates a function, so it must be set before any kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Refuse to run with the repository root on sys.path: there, kernels/ is the top-level `kernels`,
    which shadows the PyPI `kernels` package that transformers >= 5.25 imports (every test would then fail
    at `import transformers` with "cannot import name 'CUDAProperties' from 'kernels'")."""
    spec = importlib.util.find_spec("kernels")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin == ROOT / "kernels" / "__init__.py":
        raise pytest.UsageError(
            f"`import kernels` resolves to {origin}: the repository root is on sys.path, so W12's kernels/ "
            "shadows the PyPI `kernels` package that transformers imports. Run `make test`, or "
            "`.venv/bin/pytest` (its script does not add the current directory), or `python -I -m pytest`."
        )
