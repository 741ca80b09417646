"""Transformers 5.x integration: `W12HfQuantizer` and `patch_transformers()`.

    import w12
    w12.patch_transformers()                                   # once per process (idempotent)
    model = AutoModelForCausalLM.from_pretrained(w12_dir)      # a converted checkpoint: exact BF16 model
    model = AutoModelForCausalLM.from_pretrained(bf16_dir, quantization_config=w12.W12Config())  # convert on load
    model.save_pretrained(out)                                  # a W12 checkpoint `w12 verify` accepts
    model = model.dequantize()                                  # plain BF16 nn.Linear layers, bit-exact

How a load works (transformers >= 5.19, public hooks only):

* pre-quantized: `_process_model_before_weight_loading` reads the safetensors headers of the checkpoint
  files (Transformers passes them as `checkpoint_files`) and swaps every nn.Linear whose `P.weight` is
  a W12 matrix there for a meta-device `W12Linear` whose buffers have exactly the file's names, dtypes
  and shapes (the escape count is data-dependent: it comes from the header). The stock loader then
  copies the integer tensors without any cast. After loading, every matrix is validated (SPEC.md §9).
* on the fly: the nn.Linear layers selected by include/exclude/modules_to_not_convert (never tied or
  output embeddings) become `W12Linear`; `param_needs_quantization` marks their `weight`, and the
  quantize op (`W12Quantize`) encodes each BF16 weight as it is read, so the BF16 model is never held
  in memory as a whole.
* CUDA: after loading, `w12.runtime.prepare(model)` builds escape tables and fuses sibling projections
  (q/k/v, gate/up: one GEMM each, runtime/fused.py); env `W12_FUSE=0` keeps one GEMM per layer.
* save: `get_state_dict_and_metadata` adds the `w12` header (SPEC.md §7) to the safetensors metadata;
  for a save split into several shards the per-file headers are rewritten right after writing (each
  header must list only its own file's matrices), by a `save_pretrained` wrapper set on the model.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
import os
import types
from pathlib import Path

import torch
from torch import nn
from transformers.core_model_loading import ConversionOps
from transformers.quantizers import HfQuantizer

from w12.formats.layout import COMPANION_SUFFIXES, FORMAT_VERSION, HEADER_KEY, companion_names

from .hf_config import W12Config
from .fused import unshared_state_dict
from .w12_linear import BUFFER_NAMES, W12Linear, prepare

log = logging.getLogger(__name__)


class W12LoadError(ValueError):
    """A checkpoint or model that the W12 Transformers integration cannot load as asked."""


# ---------------------------------------------------------------------------------------------
# Checkpoint headers
# ---------------------------------------------------------------------------------------------
def read_safetensors_header(path: str | os.PathLike) -> dict:
    """The JSON header of a safetensors file (tensor name -> {dtype, shape, ...}, plus __metadata__)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if size > 512 * 1024 * 1024:
            raise W12LoadError(f"{path}: safetensors header of {size} bytes is implausible")
        return json.loads(f.read(size))


def checkpoint_tensors(checkpoint_files) -> tuple[dict, dict]:
    """(tensor name -> (dtype, shape), W12 matrix name -> {"shape", "sha256", "nnz"}) of all files.
    Header-level checks of SPEC.md §9 (rules 1–4) run here through the container reader."""
    from w12.formats.container import W12File

    tensors, matrices = {}, {}
    for file in checkpoint_files or []:
        if not str(file).endswith(".safetensors"):
            raise W12LoadError(f"{file}: W12 checkpoints are safetensors files only")
        header = read_safetensors_header(file)
        meta = header.pop("__metadata__", None) or {}
        tensors.update({name: (info["dtype"], tuple(info["shape"])) for name, info in header.items()})
        if HEADER_KEY in meta:
            with W12File(file) as f:  # parses the w12 header and checks names, dtypes and shapes
                for name, info in f.header.matrices.items():
                    nnz = f.dense_layout(companion_names(name)["escapes"])[1][0]
                    matrices[name] = {"shape": tuple(info.shape), "sha256": info.sha256, "nnz": nnz}
    return tensors, matrices


def _checkpoint_name(model, module_name: str, names) -> str | None:
    """The checkpoint key of module `module_name`'s weight (with or without the base model prefix)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    candidates = [f"{module_name}.weight"]
    if prefix and module_name.startswith(prefix + "."):
        candidates.append(f"{module_name[len(prefix) + 1:]}.weight")
    elif prefix:
        candidates.append(f"{prefix}.{module_name}.weight")
    return next((c for c in candidates if c in names), None)


def _matches_module(name: str, patterns) -> bool:
    """Transformers' rule for modules_to_not_convert: an exact name, a suffix after a dot, or a regex-free glob."""
    for p in patterns or ():
        if name == p or name.endswith("." + p) or fnmatch.fnmatchcase(name, p):
            return True
    return False


def _swap(model: nn.Module, name: str, linear: nn.Linear, nnz: int) -> W12Linear:
    new = W12Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, nnz=nnz, device="meta",
                    bias_dtype=linear.bias.dtype if linear.bias is not None else torch.bfloat16)
    model.set_submodule(name, new)
    return new


def w12_modules(model: nn.Module):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, W12Linear)]


# ---------------------------------------------------------------------------------------------
# On-the-fly conversion op
# ---------------------------------------------------------------------------------------------
class W12Quantize(ConversionOps):
    """BF16 `P.weight` -> the four W12 tensors of `P` (SPEC.md §7), on the weight's device."""

    def __init__(self, hf_quantizer: "W12HfQuantizer"):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict, source_patterns=None, target_patterns=None, model=None, full_layer_name=None,
                **kwargs):
        from w12.convert.convert import hash_tensor
        from w12.formats.container import matrix_tensors
        from w12.formats.matrix import W12Matrix

        out = {}
        for key, value in input_dict.items():
            w = value[0] if isinstance(value, list) else value
            if w.dtype != torch.bfloat16:
                if not self.hf_quantizer.quantization_config.cast_bf16:
                    raise W12LoadError(f"{key} is {w.dtype}: W12 is exact for BF16 only; pass "
                                       "W12Config(cast_bf16=True) to cast first (lossy)")
                w = w.to(torch.bfloat16)
            cpu = w.detach().cpu()
            m = W12Matrix.from_bf16(cpu)
            tensors = {k: v.to(w.device) for k, v in matrix_tensors(key, m).items()}
            if model is not None:
                module = model.get_submodule(key.rpartition(".")[0])
                module.w12_sha256 = hash_tensor(cpu)
            out.update(tensors)
        return out


# ---------------------------------------------------------------------------------------------
# The quantizer
# ---------------------------------------------------------------------------------------------
class W12HfQuantizer(HfQuantizer):
    """Lossless 12-bit BF16 weights (quant_method "w12")."""

    requires_calibration = False  # pre-quantized loads and on-the-fly conversion are both supported
    serialized_names = {"weight": ["weight", "weight_exponents", "weight_esc_counts", "weight_escapes"]}

    def __init__(self, quantization_config: W12Config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self.converted: list[str] = []

    # ---- environment / dtype ---------------------------------------------------------------
    def validate_environment(self, *args, device_map=None, **kwargs):
        version = getattr(self.quantization_config, "format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise W12LoadError(f"this w12 implements format version {FORMAT_VERSION}, the checkpoint has version "
                               f"{version!r}; upgrade w12 to read it")
        if isinstance(device_map, dict) and "disk" in device_map.values():
            raise W12LoadError("W12 layers cannot be offloaded to disk; use a device_map without 'disk'")

    def update_dtype(self, dtype):
        if dtype is not None and dtype != torch.bfloat16:
            log.warning("w12: W12 weights decode to BF16; loading in torch.bfloat16 instead of %s", dtype)
        return torch.bfloat16

    # ---- model surgery ------------------------------------------------------------------------
    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        tensors, matrices = checkpoint_tensors(checkpoint_files)
        if self.pre_quantized:
            self._swap_pre_quantized(model, tensors, matrices, checkpoint_files)
        else:
            self._swap_on_the_fly(model, tensors, matrices)
        return model

    def _swap_pre_quantized(self, model, tensors, matrices, checkpoint_files):
        if not checkpoint_files:
            raise W12LoadError("a W12 checkpoint loads from safetensors files (no checkpoint_files were given: "
                               "state_dict= loading is not supported)")
        used = set()
        for name, module in list(model.named_modules()):
            if not isinstance(module, nn.Linear):
                continue
            key = _checkpoint_name(model, name, matrices)
            if key is None:
                continue
            n, k = matrices[key]["shape"]
            if (n, k) != (module.out_features, module.in_features):
                raise W12LoadError(f"{key}: W12 matrix of shape [{n}, {k}] for {name}, an nn.Linear of shape "
                                   f"[{module.out_features}, {module.in_features}]")
            new = _swap(model, name, module, matrices[key]["nnz"])
            new.w12_sha256 = matrices[key]["sha256"]
            used.add(key)
            self.converted.append(name)
        left = sorted(set(matrices) - used)
        if left:
            owner = left[0][: -len(".weight")]
            kind = type(_get(model, owner)).__name__ if _get(model, owner) is not None else "no module of the model"
            raise W12LoadError(
                f"{len(left)} W12 matrices belong to no nn.Linear of {type(model).__name__} (first: {left[0]}, "
                f"{kind}); the Transformers integration loads W12 nn.Linear weights only: re-convert with "
                f"`w12 convert --exclude` for those tensors")

    def _swap_on_the_fly(self, model, tensors, matrices):
        if matrices:
            raise W12LoadError("this checkpoint is already W12 but its config.json has no w12 quantization_config")
        cfg = self.quantization_config
        skip = list(cfg.modules_to_not_convert or []) + list(getattr(model, "_keep_in_fp32_modules", None) or [])
        tied = getattr(model, "all_tied_weights_keys", None) or {}
        skip += [k.removesuffix(".weight") for k in (*tied.keys(), *tied.values())]
        out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        skip += [n for n, mod in model.named_modules() if out_emb is not None and mod is out_emb]
        kept, cast = [], set()
        for name, module in list(model.named_modules()):
            if not isinstance(module, nn.Linear):
                continue
            weight = f"{name}.weight"
            ok = (any(fnmatch.fnmatchcase(weight, p) for p in cfg.include)
                  and not any(fnmatch.fnmatchcase(weight, p) for p in cfg.exclude)
                  and not _matches_module(name, skip))
            key = _checkpoint_name(model, name, tensors) if tensors else weight
            if ok and tensors and key is None:
                ok = False  # not in the checkpoint (tied/derived weight): leave it alone
            if not ok:
                kept.append(name)
                continue
            dtype = tensors.get(key, ("BF16",))[0] if tensors else "BF16"
            if dtype != "BF16":
                if not cfg.cast_bf16:
                    raise W12LoadError(f"{key} is {dtype}: W12 is exact for BF16 weights only; pass "
                                       "W12Config(cast_bf16=True) to cast to BF16 first (lossy, recorded)")
                cast.add(dtype)
            _swap(model, name, module, 0)
            self.converted.append(name)
        cfg.cast_from = {"F32": "float32", "F16": "float16", "F64": "float64"}.get(next(iter(cast), None))
        # as `w12 convert` writes it: every 2-D weight of the checkpoint left in its dtype, plus kept Linears
        converted = {_checkpoint_name(model, n, tensors) or f"{n}.weight" for n in self.converted}
        kept_2d = [k[: -len(".weight")] for k, (_, shape) in tensors.items()
                   if len(shape) == 2 and k.endswith(".weight") and k not in converted]
        cfg.modules_to_not_convert = sorted(set(kept_2d) if tensors else set(kept))
        cfg.converted_count = len(self.converted)

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        if self.pre_quantized:
            return False
        module_name, _, tensor = param_name.rpartition(".")
        return tensor in BUFFER_NAMES and isinstance(_get(model, module_name), W12Linear)

    def get_quantize_ops(self):
        return W12Quantize(self)

    @property
    def quantized_element_size(self) -> float | None:
        return 1.5  # bytes per weight, for device-map memory estimates of on-the-fly conversion

    def _process_model_after_weight_loading(self, model, **kwargs):
        mods = w12_modules(model)
        for name, m in mods:
            for t in BUFFER_NAMES:
                if getattr(m, t).device.type == "meta":
                    raise W12LoadError(f"{name}.{t} was not loaded from the checkpoint")
        if getattr(self.quantization_config, "validate", True):
            from w12.formats.errors import W12Error

            for name, m in mods:
                try:
                    m.matrix()  # SPEC.md §9: every field checked before the data is used
                except W12Error as e:
                    raise type(e)(f"{name}.weight: {e}") from None
        if self.pre_quantized and getattr(self.quantization_config, "dequantize", False):
            self._dequantize(model)
        else:
            prepare(model)  # escape tables; on CUDA also fuses q/k/v and gate/up (env W12_FUSE=0: not)
            _install_save_wrapper(model)
        mode = getattr(self.quantization_config, "certified_lm_head", False)
        if mode:  # the certified INT8 LM head for greedy generate (w12.kernels.lm_head_int8)
            from w12.kernels.lm_head_int8 import install_certified_lm_head

            try:
                install_certified_lm_head(model, strict=mode == "strict")
            except ValueError as e:
                raise W12LoadError(f"certified_lm_head: {e}") from None
        return model

    def _dequantize(self, model, dtype=None):
        for name, m in w12_modules(model):
            w = m.dequantize()
            lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
            lin.weight = nn.Parameter(w if dtype is None or dtype == w.dtype else w.to(dtype), requires_grad=False)
            if m.bias is not None:
                lin.bias = nn.Parameter(m.bias.detach().clone(), requires_grad=False)
            model.set_submodule(name, lin)
        model.__dict__.pop("save_pretrained", None)
        return model

    # ---- flags -------------------------------------------------------------------------------
    def is_serializable(self, safe_serialization=None):
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True

    # ---- save ---------------------------------------------------------------------------------
    def get_state_dict_and_metadata(self, model):
        """The header for a single-file save (tied weights are dropped by the writer, so by us too);
        `fix_saved_headers` rewrites it per file when the save is sharded. Members of a fused projection
        group are saved from contiguous CPU copies of their (view) tensors."""
        state_dict = unshared_state_dict(model, model.state_dict())
        names = set(state_dict)
        try:
            from transformers.modeling_utils import remove_tied_weights_from_state_dict

            names = set(remove_tied_weights_from_state_dict(dict(state_dict), model))
        except Exception:  # an older/newer Transformers: the post-save fix-up still makes headers right
            pass
        return state_dict, {HEADER_KEY: w12_header(model, state_dict, names)}


def _get(model, name):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


# ---------------------------------------------------------------------------------------------
# Save support: the w12 header of SPEC.md §7
# ---------------------------------------------------------------------------------------------
def w12_header(model, state_dict: dict, names: set) -> str:
    """The `w12` metadata value for a file holding the tensors `names` of `state_dict`."""
    from w12.convert.convert import hash_tensor
    from w12.formats.container import Header, MatrixInfo

    mats, dense, owned = {}, {}, set()
    for mod_name, m in w12_modules(model):
        key = f"{mod_name}.weight"
        if key not in names:
            continue
        if m.w12_sha256 is None:
            m.w12_sha256 = hash_tensor(m.dequantize().cpu())
        mats[key] = MatrixInfo((m.out_features, m.in_features), m.w12_sha256)
        owned.update(companion_names(key).values())
    for name in sorted(names - owned):
        t = state_dict[name]
        if name.endswith(COMPANION_SUFFIXES):
            raise W12LoadError(f"{name} looks like a W12 tensor but belongs to no W12Linear")
        dense[name] = hash_tensor(t.detach().cpu())
    return Header(FORMAT_VERSION, mats, dense).to_json()


def fix_saved_headers(model, save_directory: str | os.PathLike) -> list[str]:
    """Rewrite the `w12` header of every safetensors file of a sharded `save_pretrained` output so that
    each lists only its own matrices (SPEC.md §7). Files whose header is already right are left alone.
    Returns the rewritten file names."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = Path(save_directory)
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    files = sorted({f for i in indexes for f in json.loads(i.read_text())["weight_map"].values()})
    files = files or sorted(p.name for p in folder.glob("*.safetensors"))
    by_name = dict(model.state_dict())
    rewritten = []
    for file in files:
        path = folder / file
        with safe_open(path, framework="pt") as f:
            names = set(f.keys())
            meta = dict(f.metadata() or {})
            want = w12_header(model, by_name, names)
            if meta.get(HEADER_KEY) == want:
                continue
            tensors = {n: f.get_tensor(n) for n in names}
        meta[HEADER_KEY] = want
        tmp = path.with_name(path.name + ".w12tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)
        rewritten.append(file)
    return rewritten


def _install_save_wrapper(model) -> None:
    """`model.save_pretrained(...)` = the stock method, then per-shard header fix-up (instance attribute)."""
    if "save_pretrained" in model.__dict__:
        return
    stock = type(model).save_pretrained

    @functools.wraps(stock)
    def save_pretrained(self, save_directory, *args, **kwargs):
        out = stock(self, save_directory, *args, **kwargs)
        if getattr(self, "hf_quantizer", None) is not None and isinstance(self.hf_quantizer, W12HfQuantizer):
            fix_saved_headers(self, save_directory)
        return out

    model.save_pretrained = types.MethodType(save_pretrained, model)


def save_pretrained(model, save_directory, *args, **kwargs):
    """`model.save_pretrained` plus the W12 header fix-up, for models whose wrapper was lost."""
    type(model).save_pretrained(model, save_directory, *args, **kwargs)
    fix_saved_headers(model, save_directory)


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------
def patch_transformers() -> None:
    """Register W12Config and W12HfQuantizer under quant_method "w12" with Transformers (idempotent)."""
    from transformers.quantizers import auto

    for mapping, cls, register in ((auto.AUTO_QUANTIZATION_CONFIG_MAPPING, W12Config, auto.register_quantization_config),
                                   (auto.AUTO_QUANTIZER_MAPPING, W12HfQuantizer, auto.register_quantizer)):
        have = mapping.get("w12")
        if have is cls:
            continue
        if have is not None:
            if (have.__module__, have.__qualname__) != (cls.__module__, cls.__qualname__):
                raise RuntimeError(f"quant_method 'w12' is already registered with Transformers by "
                                   f"{have.__module__}.{have.__qualname__}")
            mapping["w12"] = cls  # the same class from a reloaded module
            continue
        register("w12")(cls)
    # so that W12Config(certified_lm_head=...) passed to from_pretrained reaches converted checkpoints too
    loading = getattr(auto, "LOADING_ATTRIBUTES_CONFIG_TYPES", None)
    if isinstance(loading, tuple) and W12Config not in loading:
        auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (*loading, W12Config)
