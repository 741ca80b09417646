"""SGLang plugin entry point: makes `--quantization w12` known to SGLang 0.5.x.

pyproject.toml declares

    [project.entry-points."sglang.srt.plugins"]
    w12 = "w12.runtime.sglang_plugin:register"

SGLang's `sglang.srt.plugins.load_plugins()` runs every general plugin in each of its processes (the CLI
before it parses arguments, the engine, and every scheduler / TP-rank subprocess), so installing `w12`
next to `sglang` is all a user does. `SGLANG_PLUGINS=a,b` is a whitelist: if it is set it must list `w12`.

This module imports nothing from SGLang at import time (w12 installs and imports without SGLang); the
quantization method itself lives in `sglang_method.py`.
"""

from __future__ import annotations

NAME = "w12"


def register() -> None:
    """Add `w12` to SGLang's quantization registry and to the `--quantization` choices. Idempotent."""
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES, add_quantization_method_choices
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    from .sglang_method import W12SGLangConfig

    QUANTIZATION_METHODS[NAME] = W12SGLangConfig
    if NAME not in QUANTIZATION_CHOICES:
        add_quantization_method_choices([NAME])


def is_registered() -> bool:
    """Whether `register()` has run in this process (False when SGLang is not installed)."""
    try:
        from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
        from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    except ImportError:
        return False
    return NAME in QUANTIZATION_METHODS and NAME in QUANTIZATION_CHOICES
