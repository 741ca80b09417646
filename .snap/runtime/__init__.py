"""runtime layer of W12 (see ../SPEC.md and the project README).

w12_linear.py: `W12Linear` (the four W12 tensors as buffers) and the forward dispatch `w12_linear`;
fused.py: projection groups (q/k/v, gate/up of one parent share one GEMM on CUDA; `prepare(model)` fuses);
hf_config.py: `W12Config` (quantization_config, SPEC.md §8); hf_quantizer.py: `W12HfQuantizer` and
`patch_transformers()` (Transformers 5.x hooks); sglang_plugin.py / sglang_method.py: the SGLang
quantization method (tp_shards.py: tensor-parallel slices; layer_apply.py: its forward dispatch).
Imports are lazy: `import w12.runtime` loads nothing heavy.
"""

_EXPORTS = {
    "W12Linear": "w12_linear", "w12_linear": "w12_linear", "prepare": "w12_linear",
    "set_cpu_decode_cache": "w12_linear", "set_cpu_gemm_op": "w12_linear",
    "fuse_projections": "fused", "unfuse_projections": "fused", "fused_groups": "fused",
    "W12Config": "hf_config",
    "W12HfQuantizer": "hf_quantizer", "patch_transformers": "hf_quantizer", "save_pretrained": "hf_quantizer",
    "fix_saved_headers": "hf_quantizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
