"""W12 as an SGLang 0.5.x quantization method (registered by `sglang_plugin.register`).

    python -m sglang.launch_server --model-path <w12 checkpoint> --quantization w12 --tp N

`W12SGLangConfig` reads the checkpoint's `quantization_config` (SPEC.md §8); `get_quant_method` gives
every linear layer a `W12LinearMethod` except the modules the checkpoint kept in their original dtype
(`modules_to_not_convert`, matched against SGLang's fused names such as `qkv_proj` / `gate_up_proj`).
Embeddings and the LM head stay BF16 (see `lm_head_method`, the hook for a W12 or INT8 head later), and
so do MoE experts (`FusedMoE`, not supported yet).

Each W12 layer holds the rank's W12 matrix as four parameters with the checkpoint's names, so SGLang's
model loaders route `P.weight`, `P.weight_exponents`, `P.weight_esc_counts`, `P.weight_escapes` (and the
stacked `q_proj`/`k_proj`/`v_proj`, `gate_proj`/`up_proj` names) to them unchanged:

    weight               u8  [NB, KB, 12288]   records of the rank's [N_r, K_r] matrix
    weight_exponents     u8  [N_PAD]
    weight_esc_counts    i32 [NB, KB]
    weight_escapes       i16 [nnz, 2]          size known only once loaded

The escapes are data-dependent in size, so SGLang's narrowing loaders can't cut them; every parameter gets
our `weight_loader` instead. It collects the four checkpoint tensors of one logical matrix (q, k, v,
gate, up, or a whole matrix), validates them (SPEC.md §9), takes this rank's rows (column-parallel,
incl. the KV-head replication of QKV layers) or columns (row-parallel) exactly as SGLang's BF16 loaders
would (tile ranges + their escape runs when tile-aligned, else decode/re-encode: `tp_shards.py`), and
when all pieces of the rank's matrix are in, stacks them along N and writes the parameters. A BF16
weight arriving where W12 was expected (a BF16 checkpoint served with `--quantization w12`) is encoded
on the fly, exactly.

`apply` goes through one dispatch function, `w12_matmul`: on CUDA with `w12.kernels` importable, the
fused GEMM `torch.ops.w12.gemm` (escape tables prepared once in `process_weights_after_loading`); on
CUDA without it, an exact decode in torch ops + `F.linear`; elsewhere the reference path, the exact
decode (the numba codec, as `W12Matrix.to_bf16` does) + `F.linear` in BF16.

This module imports SGLang; `sglang_plugin.py` imports it lazily.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Any, Optional

import torch
from torch.nn import Parameter

from sglang.srt.distributed.utils import get_group_rank_size
from sglang.srt.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    ColumnParallelLinear,
)
from sglang.srt.layers.quantization.base_config import LinearMethodBase, QuantizationConfig, QuantizeMethodBase
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.layers.quantization.utils import is_layer_skipped
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.utils import set_weight_attrs

from w12.formats.errors import W12Error
from w12.formats.layout import E_LO, FORMAT_VERSION, REC_BYTES, padded, tiles
from w12.formats.matrix import W12Matrix

from .layer_apply import clear_prepared, prepare, w12_matmul
from .tp_shards import concat_rows, rank_piece

log = logging.getLogger(__name__)

PARTS = ("weight", "weight_exponents", "weight_esc_counts", "weight_escapes")
_WARNED: set = set()


def _warn_once(key, msg, *args):
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(msg, *args)


# =============================================================================================
# Config
# =============================================================================================
class W12SGLangConfig(QuantizationConfig):
    """`quantization_config` with quant_method "w12" (SPEC.md §8). Unknown keys are ignored.

    `W12SGLangConfig()` (no checkpoint config: a BF16 checkpoint served with `--quantization w12`)
    encodes every linear layer's BF16 weight to W12 while loading.
    """

    def __init__(self, format_version: int = FORMAT_VERSION, modules_to_not_convert: Optional[list] = None,
                 include: Optional[list] = None, exclude: Optional[list] = None, from_checkpoint: bool = False):
        super().__init__()
        if type(format_version) is not int or format_version != FORMAT_VERSION:
            raise ValueError(f"w12: quantization_config.format_version {format_version!r} is not implemented by "
                             f"this reader (version {FORMAT_VERSION}); upgrade w12")
        self.format_version = format_version
        self.modules_to_not_convert = list(modules_to_not_convert or [])
        self.include = list(include) if include is not None else None
        self.exclude = list(exclude) if exclude is not None else None
        self.from_checkpoint = from_checkpoint

    # ---- QuantizationConfig interface ---------------------------------------------------------
    def get_name(self) -> str:
        return "w12"

    def get_supported_act_dtypes(self) -> list:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80  # BF16 tensor cores (Ampere); the fused kernels are Triton

    @staticmethod
    def get_config_filenames() -> list:
        return []  # config.json's quantization_config is all W12 needs

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "W12SGLangConfig":
        method = config.get("quant_method", "w12")
        if str(method).lower() != "w12":
            raise ValueError(f"w12: quantization_config.quant_method must be 'w12', found {method!r}")
        if "format_version" not in config:
            raise ValueError("w12: quantization_config has no format_version (SPEC.md §8 requires it)")
        cfg = cls(format_version=config["format_version"],
                  modules_to_not_convert=config.get("modules_to_not_convert"),
                  include=config.get("include"), exclude=config.get("exclude"), from_checkpoint=True)
        mapping = config.get("packed_modules_mapping")  # injected by SGLang's get_quant_config
        if mapping:
            cfg.packed_modules_mapping = dict(mapping)
        return cfg  # every other key (tile, window, cast_from, hf_config, ...) is ignored

    def get_scaled_act_names(self) -> list:
        return []

    def apply_weight_name_mapper(self, hf_to_sglang_mapper) -> None:
        if self.modules_to_not_convert:
            self.modules_to_not_convert = list(dict.fromkeys(hf_to_sglang_mapper.apply_list(
                self.modules_to_not_convert)))

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        if isinstance(layer, LinearBase):
            if self.is_skipped(prefix):
                return UnquantizedLinearMethod()
            return W12LinearMethod(self, prefix)
        if isinstance(layer, VocabParallelEmbedding):  # includes ParallelLMHead
            return self.lm_head_method(layer, prefix)
        if any(c.__name__ == "FusedMoE" for c in type(layer).__mro__):
            _warn_once("moe", "w12: MoE experts (%s) load unquantized: W12 experts are not supported in SGLang yet "
                       "(convert MoE checkpoints with --exclude '*experts*')", prefix)
        return None

    # ---- policies -------------------------------------------------------------------------------
    def is_skipped(self, prefix: str) -> bool:
        """Whether the linear layer `prefix` was kept in its original dtype by the converter."""
        if not prefix or not self.modules_to_not_convert:
            return False
        return is_layer_skipped(prefix, self.modules_to_not_convert, fused_mapping=self.packed_modules_mapping)

    def lm_head_method(self, layer: torch.nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        """LM head / embedding policy. Today: BF16 (None = SGLang's unquantized embedding method).

        The hook for later: return a method here for a W12 LM head, or for the certified INT8 head. It must
        implement `create_weights(layer, embedding_dim, [vocab_per_partition], embedding_dim, vocab_padded,
        params_dtype=..., weight_loader=...)` as `ParallelLMHead` calls it (vocab-sharded, padded rows),
        `apply(layer, hidden, bias)` for the logits, and `embedding(layer, ids)` for a plain
        `VocabParallelEmbedding`; tied embeddings alias `embed_tokens.weight`, so both must agree.
        """
        if self.from_checkpoint and self.exclude is not None:
            name = f"{prefix}.weight"
            converted = (any(fnmatch.fnmatchcase(name, p) for p in (self.include or ["*"]))
                         and not any(fnmatch.fnmatchcase(name, p) for p in self.exclude))
            if converted and prefix not in self.modules_to_not_convert:
                kind = "LM head" if isinstance(layer, ParallelLMHead) else "embedding"
                raise NotImplementedError(
                    f"w12: the checkpoint's conversion patterns (include={self.include}, exclude={self.exclude}) "
                    f"convert the {kind} {name}, but SGLang serves embeddings and the LM head in BF16 only; "
                    "re-convert with the default --exclude ('*embed*', '*lm_head*')")
        return None


# =============================================================================================
# Linear method
# =============================================================================================
class W12LinearMethod(LinearMethodBase):
    """One instance per layer (it knows the layer's prefix, for error messages)."""

    def __init__(self, config: W12SGLangConfig, prefix: str = ""):
        self.config = config
        self.prefix = prefix

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int, output_partition_sizes: list,
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs):
        n, k = int(sum(output_partition_sizes)), int(input_size_per_partition)
        nb, kb = tiles(n, k)
        n_pad, _ = padded(n, k)
        params = {
            "weight": torch.zeros(nb, kb, REC_BYTES, dtype=torch.uint8),
            "weight_exponents": torch.full((n_pad,), E_LO, dtype=torch.uint8),
            "weight_esc_counts": torch.zeros(nb, kb, dtype=torch.int32),
            "weight_escapes": torch.zeros(0, 2, dtype=torch.int16),
        }
        attrs = {key: v for key, v in extra_weight_attrs.items() if key != "weight_loader"}
        for name, data in params.items():
            p = Parameter(data, requires_grad=False)
            layer.register_parameter(name, p)
            set_weight_attrs(p, {**attrs, "w12_part": name, "weight_loader": self._loader(layer, name)})
        layer.w12_shape = (n, k)
        layer.w12_prefix = self.prefix
        layer.w12_params_dtype = params_dtype
        layer._w12_parts = {}   # shard id -> {part name: full checkpoint tensor}, until all four are in
        layer._w12_pieces = {}  # row offset in the rank's matrix -> W12Matrix piece, until the rank's N is covered
        layer._w12_loaded = False

    # ---- loading --------------------------------------------------------------------------------
    def _loader(self, layer, part: str):
        def weight_loader(param, loaded_weight: torch.Tensor, loaded_shard_id=None):
            self.load(layer, part, loaded_weight, loaded_shard_id)

        return weight_loader

    def load(self, layer, part: str, tensor: torch.Tensor, shard_id=None) -> None:
        """One checkpoint tensor (`part` of logical matrix `shard_id`) arrives."""
        if isinstance(shard_id, tuple):
            raise NotImplementedError(f"w12: {self.prefix}: multi-index shard ids {shard_id} are not supported")
        if part == "weight" and tensor.is_floating_point():
            self._load_dense(layer, tensor, shard_id)  # a BF16 weight: encode the rank's slice
            return
        parts = layer._w12_parts.setdefault(shard_id, {})
        if part in parts:
            raise ValueError(f"w12: {self._what(shard_id)}: {part} loaded twice")
        parts[part] = tensor
        if len(parts) == len(PARTS):
            del layer._w12_parts[shard_id]
            self._load_matrix(layer, parts, shard_id)

    def _what(self, shard_id) -> str:
        return self.prefix + ("" if shard_id is None else f" (shard {shard_id!r})")

    def _load_matrix(self, layer, parts: dict, shard_id) -> None:
        n_src, k_src, rows, cols = source_geometry(layer, shard_id)
        t = {p: parts[p].detach().to("cpu").contiguous() for p in PARTS}
        try:
            src = W12Matrix(t["weight"], t["weight_exponents"], t["weight_esc_counts"], t["weight_escapes"],
                            (n_src, k_src))
        except W12Error as e:  # name the layer: SPEC.md §9 errors name only the tensor
            raise type(e)(f"w12: {self._what(shard_id)}, expected a [{n_src}, {k_src}] matrix: {e}") from e
        for r0, r1, dst in rows:
            self._add_piece(layer, dst, rank_piece(src, (r0, r1), cols, name=self._what(shard_id)))

    def _load_dense(self, layer, w: torch.Tensor, shard_id) -> None:
        n_src, k_src, rows, cols = source_geometry(layer, shard_id)
        if tuple(w.shape) != (n_src, k_src):
            raise ValueError(f"w12: {self._what(shard_id)}: expected a [{n_src}, {k_src}] weight, found "
                             f"{list(w.shape)} {w.dtype}")
        if w.dtype != torch.bfloat16:
            _warn_once(("cast", w.dtype), "w12: casting %s weights to BF16 before encoding (as SGLang does for "
                       "an unquantized BF16 model); W12 is exact for BF16 weights", w.dtype)
        w = w.detach().to("cpu", torch.bfloat16)
        c0, c1 = cols if cols is not None else (0, k_src)
        for r0, r1, dst in rows:
            self._add_piece(layer, dst, W12Matrix.from_bf16(w[r0:r1, c0:c1].contiguous()))

    def _add_piece(self, layer, dst: int, piece: W12Matrix) -> None:
        n, k = layer.w12_shape
        if piece.k != k or dst < 0 or dst + piece.n > n:
            raise ValueError(f"w12: {self.prefix}: a [{piece.n}, {piece.k}] piece at row {dst} does not fit the "
                             f"rank's [{n}, {k}] matrix")
        layer._w12_pieces[dst] = piece
        covered = sum(p.n for p in layer._w12_pieces.values())
        if covered < n:
            return
        order = sorted(layer._w12_pieces)
        pieces = [layer._w12_pieces[o] for o in order]
        if [o for o in order] != [sum(p.n for p in pieces[:i]) for i in range(len(pieces))] or covered != n:
            raise ValueError(f"w12: {self.prefix}: pieces at rows {order} of sizes {[p.n for p in pieces]} do not "
                             f"tile the rank's {n} rows")
        layer._w12_pieces = {}
        self._store(layer, concat_rows(pieces))

    def _store(self, layer, m: W12Matrix) -> None:
        """Write the rank's matrix into the four parameters (on their device)."""
        for name, value in zip(PARTS, (m.records, m.exponents, m.esc_counts)):
            param = getattr(layer, name)
            if tuple(param.shape) != tuple(value.shape):
                raise ValueError(f"w12: {self.prefix}.{name}: expected {list(param.shape)}, built "
                                 f"{list(value.shape)}")
            param.data.copy_(value)
        esc = layer.weight_escapes
        esc.data = m.escapes.to(esc.device)
        layer._w12_loaded = True
        clear_prepared(layer)

    # ---- after loading --------------------------------------------------------------------------
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        missing = []
        for shard_id, parts in layer._w12_parts.items():
            missing.append(f"{self._what(shard_id)} has {sorted(parts)} but not "
                           f"{sorted(set(PARTS) - set(parts))}")
        if layer._w12_pieces:
            n = layer.w12_shape[0]
            have = sorted((o, o + p.n) for o, p in layer._w12_pieces.items())
            missing.append(f"{self.prefix}: rows {have} of the rank's {n} rows were loaded, the rest never arrived")
        if missing:
            raise ValueError("w12: incomplete W12 weights in the checkpoint: " + "; ".join(missing))
        if not layer._w12_loaded:
            _warn_once(("unloaded", self.prefix), "w12: %s received no weights (dummy load format?); it decodes "
                       "to a constant matrix", self.prefix)
        for name in PARTS:
            p = getattr(layer, name)
            if not isinstance(p, Parameter) or p.requires_grad:
                setattr(layer, name, Parameter(p.data, requires_grad=False))
        prepare(layer)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return w12_matmul(x, layer, bias)


# =============================================================================================
# Which rows / columns of which checkpoint matrix a rank takes (mirrors SGLang's BF16 loaders)
# =============================================================================================
def source_geometry(layer, shard_id):
    """(N, K of the checkpoint matrix that `shard_id` names, [(row0, row1, row offset in the rank's matrix)],
    (col0, col1) or None) for this layer's rank, exactly as SGLang's v1 weight loaders narrow a BF16 weight."""
    presharded = bool(getattr(layer, "use_presharded_weights", False))
    tp_rank, tp_size = get_group_rank_size(getattr(layer, "tp_group", None))
    n_rank, k_rank = layer.w12_shape
    if isinstance(layer, RowParallelLinear):
        _no_shard(layer, shard_id)
        if presharded:
            return n_rank, k_rank, [(0, n_rank, 0)], None
        k = layer.input_size
        return layer.output_size, k, [(0, layer.output_size, 0)], (tp_rank * k_rank, (tp_rank + 1) * k_rank)
    k = layer.input_size
    if isinstance(layer, QKVParallelLinear):
        kv_rank, _ = get_group_rank_size(layer.kv_tp_group)
        full = {"q": layer.total_num_heads * layer.head_size,
                "k": layer.total_num_kv_heads * layer.head_size,
                "v": layer.total_num_kv_heads * layer.v_head_size}
        local = {"q": layer.num_heads * layer.head_size,
                 "k": layer.num_kv_heads * layer.head_size,
                 "v": layer.num_kv_heads * layer.v_head_size}
        index = {"q": tp_rank, "k": kv_rank // layer.num_kv_head_replicas,
                 "v": kv_rank // layer.num_kv_head_replicas}
        return _merged(("q", "k", "v"), full, local, index, shard_id, presharded, k)
    if isinstance(layer, MergedColumnParallelLinear):
        ids = tuple(range(len(layer.output_sizes)))
        full = {i: s for i, s in zip(ids, layer.output_sizes)}
        local = {i: s // tp_size for i, s in full.items()}
        return _merged(ids, full, local, {i: tp_rank for i in ids}, shard_id, presharded, k)
    if isinstance(layer, ColumnParallelLinear):
        _no_shard(layer, shard_id)
        if presharded:
            return n_rank, k, [(0, n_rank, 0)], None
        return layer.output_size, k, [(tp_rank * n_rank, (tp_rank + 1) * n_rank, 0)], None
    # ReplicatedLinear and other unsharded linears: the whole matrix
    _no_shard(layer, shard_id)
    return layer.output_size, k, [(0, layer.output_size, 0)], None


def _merged(ids, full, local, index, shard_id, presharded, k):
    dst = {}
    off = 0
    for i in ids:
        dst[i], off = off, off + local[i]
    src_sizes = local if presharded else full
    start = {i: 0 if presharded else index[i] * local[i] for i in ids}
    if shard_id is None:  # fused in the checkpoint: one matrix holding every logical part
        rows, src_off = [], 0
        for i in ids:
            rows.append((src_off + start[i], src_off + start[i] + local[i], dst[i]))
            src_off += src_sizes[i]
        return src_off, k, rows, None
    if shard_id not in full:
        raise ValueError(f"w12: unknown shard id {shard_id!r} (expected one of {list(ids)})")
    return src_sizes[shard_id], k, [(start[shard_id], start[shard_id] + local[shard_id], dst[shard_id])], None


def _no_shard(layer, shard_id):
    if shard_id is not None:
        raise ValueError(f"w12: {getattr(layer, 'w12_prefix', '')}: a {type(layer).__name__} takes no shard id, "
                         f"got {shard_id!r}")


def layer_matrix(layer) -> W12Matrix:
    """The layer's rank-local W12 matrix (validated, on the CPU): for tests and debugging."""
    return W12Matrix(layer.weight.detach().cpu(), layer.weight_exponents.detach().cpu(),
                     layer.weight_esc_counts.detach().cpu(), layer.weight_escapes.detach().cpu(), layer.w12_shape)
