"""W12: lossless 12-bit BF16 weights. Public API.

Heavy integrations (Transformers, SGLang, Triton) are imported lazily, when first used.
"""

__version__ = "0.1.0"

from w12.formats.errors import W12Error  # noqa: E402,F401
