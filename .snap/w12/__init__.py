"""W12: lossless 12-bit BF16 weights. Public API.

Heavy integrations (Transformers, SGLang, Triton) are imported lazily, when first used:

    import w12
    w12.patch_transformers()        # register quant_method "w12" with Transformers
    w12.W12Config(...)              # its quantization_config (importing it also registers)
"""

__version__ = "0.1.0"

from w12.formats.errors import W12Error  # noqa: E402,F401


def patch_transformers() -> None:
    """Register W12 with Transformers (`from_pretrained` of W12 checkpoints, on-the-fly conversion). Idempotent."""
    from w12.runtime.hf_quantizer import patch_transformers as _patch

    _patch()


def __getattr__(name):
    if name == "W12Config":
        patch_transformers()  # a W12Config is only useful with the quantizer registered
        from w12.runtime.hf_config import W12Config

        return W12Config
    raise AttributeError(f"module 'w12' has no attribute {name!r}")
