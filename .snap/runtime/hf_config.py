"""`W12Config`: the `quantization_config` of a W12 checkpoint (SPEC.md §8) for Transformers.

Loading a converted checkpoint needs no config object (config.json carries it). Passing one converts a
BF16 checkpoint while it loads:

    model = AutoModelForCausalLM.from_pretrained(bf16_dir, quantization_config=W12Config())
    model.save_pretrained(w12_dir)          # a W12 checkpoint that `w12 verify` accepts

Fields mirror SPEC.md §8; unknown keys are kept (and written back) but otherwise ignored. The
conversion options (`include`, `exclude`, `cast_bf16`, `modules_to_not_convert`) mean what they mean
for `w12 convert`: glob patterns on weight names ("model.layers.0.mlp.up_proj.weight"), and module
names (or suffixes of them) kept in their original dtype.
"""

from __future__ import annotations

import copy

from transformers.utils.quantization_config import QuantizationConfigMixin

from w12.formats.layout import FORMAT_VERSION, TK, TN, WIN

DEFAULT_EXCLUDE = ("*embed*", "*lm_head*")  # same as w12.convert.convert.DEFAULT_EXCLUDE


class W12Config(QuantizationConfigMixin):
    """quant_method "w12". Known fields:

    format_version          SPEC version of every file (MUST be 1 for this reader)
    tile, window            informative copies of the format constants
    modules_to_not_convert  modules kept in their original dtype (lm_head, tied embeddings, ...)
    cast_from               null, or "float32"/"float16" when the source was cast to BF16 first
    include, exclude        on-the-fly conversion: glob patterns on weight names (as `w12 convert`)
    cast_bf16               on-the-fly conversion of FP32/FP16 matrices: cast to BF16 first (lossy)
    validate                check every loaded matrix against SPEC.md §9 after loading (default True)
    dequantize              load a W12 checkpoint straight into plain BF16 nn.Linear layers
    certified_lm_head       False (default), True or "strict": replace the LM head by the certified INT8 head
                            (w12.kernels.lm_head_int8): greedy `generate` reads the INT8 copy plus a few exact
                            rows; every caller that needs full logits (sampling, scores, ...) gets them.
                            "strict": rows whose winner could depend on the exact head's summation order
                            are answered by the full head (one host sync per call on CUDA).  A loading-time
                            switch: honoured for converted checkpoints too, never written to config.json.
    """

    def __init__(self, format_version: int = FORMAT_VERSION, tile=(TN, TK), window: int = WIN,
                 modules_to_not_convert: list[str] | None = None, cast_from: str | None = None,
                 include=("*",), exclude=DEFAULT_EXCLUDE, cast_bf16: bool = False, validate: bool = True,
                 dequantize: bool = False, certified_lm_head: bool | str = False, **kwargs):
        kwargs.pop("quant_method", None)
        self.quant_method = "w12"
        self.format_version = format_version
        self.tile = list(tile)
        self.window = window
        self.modules_to_not_convert = list(modules_to_not_convert) if modules_to_not_convert is not None else None
        self.cast_from = cast_from
        self.include = list(include)
        self.exclude = list(exclude)
        self.cast_bf16 = bool(cast_bf16)
        self.validate = bool(validate)
        self.dequantize = bool(dequantize)
        self.certified_lm_head = certified_lm_head
        for key, value in kwargs.items():  # readers MUST ignore unknown keys (SPEC.md §8); we keep them
            setattr(self, key, value)
        self.post_init()

    def post_init(self):
        if type(self.format_version) is not int:
            raise ValueError(f"W12Config.format_version must be an integer, found {self.format_version!r}")
        if self.certified_lm_head not in (False, True, "strict") or type(self.certified_lm_head) not in (bool, str):
            raise ValueError(f"W12Config.certified_lm_head must be False, True or 'strict', "
                             f"found {self.certified_lm_head!r}")

    def get_loading_attributes(self) -> dict:
        """Fields that a `quantization_config` passed to `from_pretrained` sets on a converted checkpoint's
        config (Transformers merges them; patch_transformers registers W12Config for that)."""
        return {"certified_lm_head": self.certified_lm_head}

    def to_dict(self) -> dict:
        d = copy.deepcopy(self.__dict__)
        # loading-time switches are not part of a checkpoint's description
        for key in ("validate", "dequantize", "cast_bf16", "certified_lm_head"):
            d.pop(key, None)
        return d

    def to_diff_dict(self) -> dict:
        return self.to_dict()

    def __repr__(self):
        return f"W12Config({self.to_json_string(use_diff=False).strip()})"
