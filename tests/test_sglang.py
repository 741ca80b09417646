"""W12 in SGLang 0.5.x, on the CPU: config, plugin registration, create_weights, TP-sharded loading, apply.

These tests need SGLang, which can't share the project venv (it pins transformers 5.19 and a CUDA torch).
`make test` therefore runs this module twice: in the project venv, where it is skipped, and right after in
`.venv-sglang` (built by tests/sglang_env.sh: CPU torch + `sglang --no-deps` + the pure-Python deps its
layer modules import + tests/stubs/torchvision), where it MUST run: there (or with W12_REQUIRE_SGLANG=1)
a failed `import sglang` is an error, not a skip.

No SGLang server or CUDA kernel runs here. Layers are SGLang's own (`QKVParallelLinear`,
`MergedColumnParallelLinear`, `RowParallelLinear`, `ColumnParallelLinear`, `ReplicatedLinear`) built under
a published TP topology (`sglang.test.parallel_groups.publish`, one rank at a time, TP = 1, 2, 4, 8).
Each W12 layer gets a BF16 twin (same layer class, no quantization) loaded from the original BF16
checkpoint through SGLang's own loaders: the twin's weight is exactly the slice SGLang would serve, and the
W12 layer's rank matrix must decode to it bit for bit, and `apply` must equal `F.linear` with it.
"""

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REQUIRED = os.environ.get("W12_REQUIRE_SGLANG") == "1" or Path(sys.prefix).name == ".venv-sglang"
try:
    import sglang  # noqa: F401
except ImportError:
    if REQUIRED:
        raise
    pytest.skip("SGLang is not installed in this venv; `make test` runs tests/test_sglang.py again in "
                ".venv-sglang (built by tests/sglang_env.sh), where it must pass", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from sglang.srt.layers.linear import (  # noqa: E402
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod  # noqa: E402
from sglang.srt.model_loader.auto_loader import STANDARD_STACKED_MAPPING  # noqa: E402
from sglang.srt.model_loader.weight_utils import default_weight_loader  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, reset_context  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.test.parallel_groups import publish  # noqa: E402
from torch import nn  # noqa: E402

from w12.formats.errors import W12Error  # noqa: E402
from w12.formats.matrix import W12Matrix  # noqa: E402
from w12.runtime import sglang_plugin  # noqa: E402
from w12.runtime.sglang_method import (  # noqa: E402
    W12LinearMethod,
    W12SGLangConfig,
    layer_matrix,
    source_geometry,
)
from w12.runtime.tp_shards import UnalignedShardError, concat_rows, rank_piece  # noqa: E402

BF16 = torch.bfloat16
TP_RANKS = [(tp, r) for tp in (1, 2, 4, 8) for r in range(tp)]
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def set_topology(tp: int, rank: int) -> None:
    reset_context()
    publish(ServerArgs(model_path="dummy", tp_size=tp), role="test", ranks=SpawnRanks(world_rank=rank))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.int16)


def special_matrix(n: int, k: int, seed: int, rate: float = 0.004) -> torch.Tensor:
    """A BF16 matrix like a trained weight, plus escapes of every kind: zeros, denormals, outliers far above
    and below the row's window, ±inf and NaN."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(BF16)
    specials = torch.tensor([0.0, -0.0, 1e-40, -3e-39, 30.0, -1e5, 1e-12, float("inf"), float("-inf"),
                             float("nan")]).to(BF16)
    m = int(n * k * rate) + len(specials)
    idx = torch.randperm(n * k, generator=g)[:m]
    w.view(-1)[idx] = specials[torch.arange(m) % len(specials)]
    return w


class Decoder(nn.Module):
    """The linear layers of one Llama decoder layer, named as SGLang's LlamaForCausalLM names them."""

    def __init__(self, cfg: dict, quant_config, layer: int = 0):
        super().__init__()
        h, heads, kv, hd, inter = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["inter"]
        p = f"model.layers.{layer}"
        kw = dict(quant_config=quant_config, params_dtype=BF16)
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = QKVParallelLinear(h, hd, heads, kv, bias=cfg["bias"],
                                                    prefix=f"{p}.self_attn.qkv_proj", **kw)
        self.self_attn.o_proj = RowParallelLinear(heads * hd, h, bias=False, prefix=f"{p}.self_attn.o_proj", **kw)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = MergedColumnParallelLinear(h, [inter, inter], bias=False,
                                                           prefix=f"{p}.mlp.gate_up_proj", **kw)
        self.mlp.down_proj = RowParallelLinear(inter, h, bias=False, prefix=f"{p}.mlp.down_proj", **kw)

    def linears(self) -> dict:
        return {"qkv_proj": self.self_attn.qkv_proj, "o_proj": self.self_attn.o_proj,
                "gate_up_proj": self.mlp.gate_up_proj, "down_proj": self.mlp.down_proj}


class Model(nn.Module):
    def __init__(self, cfg: dict, quant_config):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([Decoder(cfg, quant_config, i) for i in range(cfg["layers"])])


def load_like_sglang(module: nn.Module, weights) -> set:
    """What LlamaForCausalLM.load_weights does (stacked q/k/v, gate/up names -> fused params, shard ids),
    then DefaultModelLoader's post-processing (process_weights_after_loading per module)."""
    params = dict(module.named_parameters())
    loaded = set()
    for name, tensor in weights:
        target = STANDARD_STACKED_MAPPING.try_load(name, tensor, params)
        if target is not None:
            loaded.add(target)
            continue
        if name in params:
            getattr(params[name], "weight_loader", default_weight_loader)(params[name], tensor)
            loaded.add(name)
    for m in module.modules():
        qm = getattr(m, "quant_method", None)
        if qm is not None and hasattr(qm, "process_weights_after_loading"):
            qm.process_weights_after_loading(m)
    return loaded


def read_checkpoint(folder: Path):
    """(name, tensor) of every file, in file order, as SGLang's safetensors iterator yields them."""
    out = []
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(f, framework="pt") as st:
            out += [(k, st.get_tensor(k)) for k in st.keys() if k.startswith("model.layers.")]
    return out


def w12_config(folder: Path) -> W12SGLangConfig:
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    # as SGLang's get_quant_config passes it: plus packed_modules_mapping and hf_config
    return W12SGLangConfig.from_config({**qc, "packed_modules_mapping": PACKED, "hf_config": object()})


def assert_same_layer(w12_layer, bf16_layer, what: str, seed: int = 0):
    """The W12 rank matrix decodes to the BF16 twin's weight bit for bit; apply == F.linear with it."""
    assert isinstance(w12_layer.quant_method, W12LinearMethod), what
    assert w12_layer.weight.dtype == torch.uint8, what
    m = layer_matrix(w12_layer)
    ref = bf16_layer.weight.detach()
    assert ref.dtype == BF16
    assert m.shape == tuple(ref.shape), what
    assert torch.equal(bits(m.to_bf16()), bits(ref)), f"{what}: decoded W12 slice differs from SGLang's BF16 slice"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, ref.shape[1], generator=g).to(BF16)
    bias = getattr(bf16_layer, "bias", None)
    if bias is not None:
        assert torch.equal(bits(w12_layer.bias), bits(bias)), what
    y = w12_layer.quant_method.apply(w12_layer, x, w12_layer.bias if bias is not None else None)
    y_ref = F.linear(x, ref, bias)
    assert y.dtype == BF16 and torch.equal(bits(y), bits(y_ref)), f"{what}: apply differs from F.linear"
    y_twin = bf16_layer.quant_method.apply(bf16_layer, x, bias)
    assert torch.equal(bits(y), bits(y_twin)), what


# ---------------------------------------------------------------------------------------------
# Checkpoints: tiny Llama-shaped BF16 models with escapes of every kind, converted by `w12 convert`
# ---------------------------------------------------------------------------------------------
CONFIGS = {
    # unaligned everywhere beyond TP=1/2: q/k/v of 64 rows per head group, kv heads replicated at TP 4 and 8,
    # intermediate 384 (48 rows / columns per rank at TP 8), q/k/v biases
    "unaligned": dict(hidden=256, heads=8, kv_heads=2, head_dim=32, inter=384, bias=True, layers=2),
    # tile-aligned at every TP size up to 8: each shard is whole tiles + escape runs (zero-copy path)
    "aligned": dict(hidden=1024, heads=8, kv_heads=8, head_dim=128, inter=1024, bias=False, layers=1),
}


def make_checkpoint(folder: Path, cfg: dict, seed: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hf = LlamaConfig(vocab_size=256, hidden_size=cfg["hidden"], intermediate_size=cfg["inter"],
                     num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                     num_key_value_heads=cfg["kv_heads"], head_dim=cfg["head_dim"],
                     attention_bias=cfg["bias"], max_position_embeddings=128, tie_word_embeddings=False)
    model = LlamaForCausalLM(hf).to(BF16)
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            if p.dim() == 2 and "embed" not in name and "lm_head" not in name:
                p.copy_(special_matrix(*p.shape, seed=seed * 1000 + i))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape).to(BF16))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from w12.convert.convert import convert

    out = {}
    for i, (key, cfg) in enumerate(CONFIGS.items()):
        root = tmp_path_factory.mktemp(key)
        src = make_checkpoint(root / "bf16", cfg, seed=i + 1)
        convert(str(src), str(root / "w12"))
        out[key] = (cfg, src, root / "w12", read_checkpoint(src), read_checkpoint(root / "w12"))
    return out


@pytest.fixture(autouse=True)
def _topology_reset():
    set_topology(1, 0)
    yield
    reset_context()


# ---------------------------------------------------------------------------------------------
# Config parsing
# ---------------------------------------------------------------------------------------------
def test_config_from_checkpoint(checkpoints):
    cfg, _, w12_dir, _, _ = checkpoints["unaligned"]
    qc = json.loads((w12_dir / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "w12" and qc["format_version"] == 1
    c = w12_config(w12_dir)
    assert c.get_name() == "w12"
    assert c.format_version == 1 and c.from_checkpoint
    assert set(c.modules_to_not_convert) == {"model.embed_tokens", "lm_head"}
    assert c.packed_modules_mapping == PACKED
    assert c.get_supported_act_dtypes() == [BF16]
    assert W12SGLangConfig.get_min_capability() == 80
    assert W12SGLangConfig.get_config_filenames() == []
    assert c.get_scaled_act_names() == []


def test_config_ignores_unknown_keys_and_rejects_bad_ones():
    c = W12SGLangConfig.from_config({"quant_method": "w12", "format_version": 1, "tile": [128, 64], "window": 16,
                                     "cast_from": None, "some_future_key": {"x": 1}, "hf_config": object()})
    assert c.modules_to_not_convert == [] and c.format_version == 1
    with pytest.raises(ValueError, match="format_version"):
        W12SGLangConfig.from_config({"quant_method": "w12"})
    with pytest.raises(ValueError, match=r"2.*version 1"):
        W12SGLangConfig.from_config({"quant_method": "w12", "format_version": 2})
    with pytest.raises(ValueError, match="quant_method"):
        W12SGLangConfig.from_config({"quant_method": "fp8", "format_version": 1})
    online = W12SGLangConfig()  # what SGLang builds for a BF16 checkpoint served with --quantization w12
    assert not online.from_checkpoint and online.modules_to_not_convert == []


def test_quant_method_policy():
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    c = W12SGLangConfig.from_config({"quant_method": "w12", "format_version": 1,
                                     "modules_to_not_convert": ["lm_head", "model.embed_tokens",
                                                                "model.layers.1.self_attn.q_proj",
                                                                "model.layers.1.self_attn.k_proj",
                                                                "model.layers.1.self_attn.v_proj",
                                                                "model.layers.2.self_attn.q_proj"],
                                     "packed_modules_mapping": PACKED,
                                     "include": ["*"], "exclude": ["*embed*", "*lm_head*"]})
    kw = dict(quant_config=c, params_dtype=BF16)
    assert isinstance(QKVParallelLinear(64, 16, 4, 2, prefix="model.layers.0.self_attn.qkv_proj", **kw).quant_method,
                      W12LinearMethod)
    kept = QKVParallelLinear(64, 16, 4, 2, prefix="model.layers.1.self_attn.qkv_proj", **kw)
    assert isinstance(kept.quant_method, UnquantizedLinearMethod) and kept.weight.dtype == BF16
    with pytest.raises(ValueError, match="some but not all shards"):
        QKVParallelLinear(64, 16, 4, 2, prefix="model.layers.2.self_attn.qkv_proj", **kw)
    # embeddings and the LM head: BF16 (SGLang's unquantized embedding method)
    emb = VocabParallelEmbedding(256, 64, quant_config=c, prefix="model.embed_tokens", params_dtype=BF16)
    head = ParallelLMHead(256, 64, quant_config=c, prefix="lm_head", params_dtype=BF16)
    for layer in (emb, head):
        assert isinstance(layer.quant_method, UnquantizedEmbeddingMethod) and layer.weight.dtype == BF16
    assert c.get_quant_method(head, "lm_head") is None
    # a checkpoint whose patterns converted the LM head: a clear refusal, not a garbled load
    converted_head = W12SGLangConfig.from_config({"quant_method": "w12", "format_version": 1,
                                                  "modules_to_not_convert": [], "include": ["*"], "exclude": []})
    with pytest.raises(NotImplementedError, match="LM head"):
        ParallelLMHead(256, 64, quant_config=converted_head, prefix="lm_head", params_dtype=BF16)
    assert c.is_linear_unquantized("model.layers.1.self_attn.qkv_proj")
    assert not c.is_linear_unquantized("model.layers.0.mlp.gate_up_proj")


# ---------------------------------------------------------------------------------------------
# Plugin registration (entry point -> load_plugins -> registry and --quantization choices)
# ---------------------------------------------------------------------------------------------
def test_entry_point_declared():
    eps = [e for e in importlib.metadata.entry_points(group="sglang.srt.plugins") if e.name == "w12"]
    assert [e.value for e in eps] == ["w12.runtime.sglang_plugin:register"]
    assert eps[0].load() is sglang_plugin.register


def test_plugin_registers_through_load_plugins(checkpoints):
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    assert QUANTIZATION_METHODS["w12"] is W12SGLangConfig
    assert get_quantization_config("w12") is W12SGLangConfig
    assert QUANTIZATION_CHOICES.count("w12") == 1
    sglang_plugin.register()  # idempotent
    sglang_plugin.register()
    assert QUANTIZATION_CHOICES.count("w12") == 1 and sglang_plugin.is_registered()
    _, _, w12_dir, _, _ = checkpoints["unaligned"]
    args = prepare_server_args(["--model-path", str(w12_dir), "--quantization", "w12", "--tp", "2"])
    assert args.quantization == "w12" and args.tp_size == 2
    # the checkpoint's config.json alone selects w12 (no --quantization)
    assert ModelConfig.from_server_args(ServerArgs(model_path=str(w12_dir))).quantization == "w12"


def test_plugin_in_a_fresh_process(checkpoints):
    """A new interpreter (as each SGLang TP-rank process is): nothing registered until load_plugins(), then
    argparse accepts --quantization w12; and `w12.runtime.sglang_plugin` imports without importing sglang."""
    _, _, w12_dir, _, _ = checkpoints["unaligned"]
    code = f"""
import sys
import w12.runtime.sglang_plugin as p
assert 'sglang' not in sys.modules, 'the plugin module must not import sglang at import time'
from sglang.srt.layers.quantization import QUANTIZATION_METHODS
from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES
assert 'w12' not in QUANTIZATION_METHODS and 'w12' not in QUANTIZATION_CHOICES
from sglang.srt.plugins import load_plugins
load_plugins()
assert 'w12' in QUANTIZATION_METHODS and 'w12' in QUANTIZATION_CHOICES
from sglang.srt.server_args import prepare_server_args
a = prepare_server_args(['--model-path', {str(w12_dir)!r}, '--quantization', 'w12'])
assert a.quantization == 'w12'
print('OK')
"""
    env = {**os.environ, "SGLANG_PLUGINS": ""}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# create_weights
# ---------------------------------------------------------------------------------------------
def test_create_weights_registers_the_four_planes():
    set_topology(2, 1)
    c = W12SGLangConfig()
    qkv = QKVParallelLinear(256, 32, 8, 2, bias=False, quant_config=c, params_dtype=BF16,
                            prefix="model.layers.0.self_attn.qkv_proj")
    n = (8 // 2 + 2 // 2 * 2) * 32  # q 4 heads + k 1 head + v 1 head per rank, 32 wide
    assert qkv.w12_shape == (n, 256) and qkv.w12_prefix == "model.layers.0.self_attn.qkv_proj"
    expect = {"weight": (torch.uint8, (2, 4, 12288)), "weight_exponents": (torch.uint8, (256,)),
              "weight_esc_counts": (torch.int32, (2, 4)), "weight_escapes": (torch.int16, (0, 2))}
    got = {name: (p.dtype, tuple(p.shape)) for name, p in qkv.named_parameters()}
    assert got == expect
    for name, p in qkv.named_parameters():
        assert not p.requires_grad and p.w12_part == name and callable(p.weight_loader)
        assert "scale" not in name  # SGLang rewrites names containing "scale"
    assert bool((qkv.weight_exponents == 16).all())
    row = RowParallelLinear(384, 200, bias=False, quant_config=c, params_dtype=BF16, prefix="o")
    assert row.w12_shape == (200, 192) and tuple(row.weight.shape) == (2, 3, 12288)
    rep = ReplicatedLinear(100, 30, bias=False, quant_config=c, params_dtype=BF16, prefix="gate")
    assert rep.w12_shape == (30, 100) and tuple(rep.weight_exponents.shape) == (128,)


# ---------------------------------------------------------------------------------------------
# Loading: every rank of TP = 1, 2, 4, 8 against SGLang's own BF16 loading
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", list(CONFIGS))
@pytest.mark.parametrize("tp,rank", TP_RANKS, ids=[f"tp{t}-rank{r}" for t, r in TP_RANKS])
def test_tp_shards_decode_to_sglang_bf16_slices(checkpoints, key, tp, rank):
    cfg, _, w12_dir, bf16_weights, w12_weights = checkpoints[key]
    assert any(t.dtype == torch.uint8 for _, t in w12_weights)  # the W12 checkpoint really holds records
    set_topology(tp, rank)
    w12_model, twin = Model(cfg, w12_config(w12_dir)), Model(cfg, None)
    loaded = load_like_sglang(w12_model, w12_weights)
    load_like_sglang(twin, bf16_weights)
    assert any(name.endswith("qkv_proj.weight_escapes") for name in loaded)
    for i, (dec, dec_twin) in enumerate(zip(w12_model.model.layers, twin.model.layers)):
        for name, layer in dec.linears().items():
            assert_same_layer(layer, dec_twin.linears()[name], f"{key} tp={tp} rank={rank} layer {i} {name}",
                              seed=tp * 100 + rank)


def test_aligned_shards_are_sub_arrays(checkpoints):
    """Tile-aligned TP slices reuse the checkpoint's bytes (windows kept, no re-encoding): the rank's records
    are the checkpoint records' tile range, and its escapes are the runs of those records."""
    cfg, _, w12_dir, _, w12_weights = checkpoints["aligned"]
    tensors = dict(w12_weights)
    p = "model.layers.0.self_attn.o_proj"
    full = W12Matrix(tensors[f"{p}.weight"], tensors[f"{p}.weight_exponents"], tensors[f"{p}.weight_esc_counts"],
                     tensors[f"{p}.weight_escapes"], (cfg["hidden"], cfg["heads"] * cfg["head_dim"]))
    q = "model.layers.0.mlp.up_proj"
    up = tensors[f"{q}.weight"]
    for tp in (2, 4, 8):
        for rank in range(tp):
            set_topology(tp, rank)
            model = Model(cfg, w12_config(w12_dir))
            load_like_sglang(model, w12_weights)
            o = model.model.layers[0].self_attn.o_proj
            kb = full.esc_counts.shape[1] // tp
            assert torch.equal(o.weight, full.records[:, rank * kb:(rank + 1) * kb])
            assert torch.equal(o.weight_exponents, full.exponents)  # the source's row windows
            ref = full.slice_cols(rank * kb * 64, (rank + 1) * kb * 64)
            assert torch.equal(o.weight_escapes, ref.escapes)
            gu = model.model.layers[0].mlp.gate_up_proj
            nb = up.shape[0] // tp
            assert torch.equal(gu.weight[-nb:], up[rank * nb:(rank + 1) * nb])  # up_proj rows follow gate_proj's


def test_fused_in_checkpoint_qkv_and_gate_up():
    """Checkpoints that store qkv_proj / gate_up_proj fused (shard id None) load per rank like SGLang's loader."""
    h, heads, kv, hd, inter = 256, 8, 2, 32, 384
    wqkv = special_matrix((heads + 2 * kv) * hd, h, seed=7)
    wgu = special_matrix(2 * inter, h, seed=8)
    mq, mgu = W12Matrix.from_bf16(wqkv), W12Matrix.from_bf16(wgu)
    for tp, rank in [(1, 0), (2, 1), (4, 2), (8, 7)]:
        set_topology(tp, rank)
        layers = {}
        for qc in (W12SGLangConfig(), None):
            kw = dict(quant_config=qc, params_dtype=BF16, bias=False)
            layers[qc is None] = (QKVParallelLinear(h, hd, heads, kv, prefix="a.qkv_proj", **kw),
                                  MergedColumnParallelLinear(h, [inter, inter], prefix="a.gate_up_proj", **kw))
        (qkv, gu), (qkv_ref, gu_ref) = layers[False], layers[True]
        for layer, m in ((qkv, mq), (gu, mgu)):
            for part, t in zip(("weight", "weight_exponents", "weight_esc_counts", "weight_escapes"),
                               (m.records, m.exponents, m.esc_counts, m.escapes)):
                getattr(layer, part).weight_loader(getattr(layer, part), t)  # no shard id: fused
            layer.quant_method.process_weights_after_loading(layer)
        qkv_ref.weight_loader(qkv_ref.weight, wqkv)
        gu_ref.weight_loader(gu_ref.weight, wgu)
        assert_same_layer(qkv, qkv_ref, f"fused qkv tp={tp} rank={rank}")
        assert_same_layer(gu, gu_ref, f"fused gate_up tp={tp} rank={rank}")


@pytest.mark.parametrize("tp,rank", [(1, 0), (2, 1), (4, 3), (8, 6)])
def test_column_and_replicated_layers(tp, rank):
    """Plain ColumnParallelLinear (N-sharded, padded N, unaligned rank rows) and ReplicatedLinear, with bias."""
    set_topology(tp, rank)
    w_col, w_rep = special_matrix(640, 200, seed=11), special_matrix(72, 100, seed=12)
    b_col, b_rep = torch.randn(640).to(BF16), torch.randn(72).to(BF16)
    for cls, w, b, args in ((ColumnParallelLinear, w_col, b_col, (200, 640)),
                            (ReplicatedLinear, w_rep, b_rep, (100, 72))):
        layer = cls(*args, bias=True, quant_config=W12SGLangConfig(), params_dtype=BF16, prefix="x.proj")
        twin = cls(*args, bias=True, quant_config=None, params_dtype=BF16, prefix="x.proj")
        m = W12Matrix.from_bf16(w)
        for part, t in zip(("weight", "weight_exponents", "weight_esc_counts", "weight_escapes"),
                           (m.records, m.exponents, m.esc_counts, m.escapes)):
            getattr(layer, part).weight_loader(getattr(layer, part), t)
        layer.bias.weight_loader(layer.bias, b)
        layer.quant_method.process_weights_after_loading(layer)
        twin.weight_loader(twin.weight, w)
        twin.bias.weight_loader(twin.bias, b)
        assert_same_layer(layer, twin, f"{cls.__name__} tp={tp} rank={rank}")


def assert_same_model(model, twin, label):
    """Every W12 linear of `model` against the same layer of the BF16 `twin`."""
    for dec, dec_twin in zip(model.model.layers, twin.model.layers):
        for name, layer in dec.linears().items():
            assert_same_layer(layer, dec_twin.linears()[name], f"{label} {name}")


@pytest.mark.parametrize("tp,rank", [(1, 0), (2, 0), (4, 1), (8, 5)])
def test_bf16_checkpoint_with_quantization_w12(checkpoints, tp, rank):
    """A BF16 checkpoint served with --quantization w12 (no quantization_config): encoded while loading."""
    cfg, _, _, bf16_weights, _ = checkpoints["unaligned"]
    set_topology(tp, rank)
    model, twin = Model(cfg, W12SGLangConfig()), Model(cfg, None)
    load_like_sglang(model, bf16_weights)
    load_like_sglang(twin, bf16_weights)
    assert_same_model(model, twin, f"online tp={tp} rank={rank}")


def test_tensor_order_does_not_matter(checkpoints):
    cfg, _, w12_dir, bf16_weights, w12_weights = checkpoints["unaligned"]
    set_topology(4, 2)
    model, twin = Model(cfg, w12_config(w12_dir)), Model(cfg, None)
    load_like_sglang(model, list(reversed(w12_weights)))
    load_like_sglang(twin, bf16_weights)
    assert_same_model(model, twin, "reversed order")


# ---------------------------------------------------------------------------------------------
# Errors and the unaligned policy
# ---------------------------------------------------------------------------------------------
def test_incomplete_checkpoint_is_an_error(checkpoints):
    cfg, _, w12_dir, _, w12_weights = checkpoints["unaligned"]
    dropped = "model.layers.0.self_attn.k_proj.weight_escapes"
    model = Model(cfg, w12_config(w12_dir))
    with pytest.raises(ValueError, match=r"qkv_proj \(shard 'k'\).*weight_escapes"):
        load_like_sglang(model, [(n, t) for n, t in w12_weights if n != dropped])


def test_corrupt_tensor_names_the_layer(checkpoints):
    cfg, _, w12_dir, _, w12_weights = checkpoints["unaligned"]
    bad = "model.layers.1.mlp.down_proj.weight_exponents"
    weights = [(n, torch.full_like(t, 7) if n == bad else t) for n, t in w12_weights]
    with pytest.raises(W12Error, match=r"model\.layers\.1\.mlp\.down_proj.*top exponent"):
        load_like_sglang(Model(cfg, w12_config(w12_dir)), weights)


def test_unaligned_policy_error(checkpoints, monkeypatch):
    cfg, _, w12_dir, _, w12_weights = checkpoints["unaligned"]
    monkeypatch.setenv("W12_TP_UNALIGNED", "error")
    set_topology(8, 3)
    with pytest.raises(UnalignedShardError, match=r"not a union of whole W12 tiles"):
        load_like_sglang(Model(cfg, w12_config(w12_dir)), w12_weights)
    # the aligned checkpoint needs no re-encoding at any TP size
    cfg_a, _, w12_dir_a, _, w12_weights_a = checkpoints["aligned"]
    load_like_sglang(Model(cfg_a, w12_config(w12_dir_a)), w12_weights_a)


def test_source_geometry_mirrors_sglang():
    """Rows each rank takes from q / k / v with KV-head replication (TP 8, 2 KV heads: 4 ranks per head)."""
    set_topology(8, 5)
    qkv = QKVParallelLinear(256, 32, 8, 2, bias=False, quant_config=W12SGLangConfig(), params_dtype=BF16, prefix="q")
    assert source_geometry(qkv, "q") == (256, 256, [(5 * 32, 6 * 32, 0)], None)
    assert source_geometry(qkv, "k") == (64, 256, [(32, 64, 32)], None)  # rank 5 // 4 replicas = head 1
    assert source_geometry(qkv, "v") == (64, 256, [(32, 64, 64)], None)
    n, k, rows, cols = source_geometry(qkv, None)
    assert (n, k, cols) == (384, 256, None) and rows == [(160, 192, 0), (256 + 32, 256 + 64, 32), (320 + 32, 384, 64)]


def test_concat_rows_and_rank_piece():
    ws = [special_matrix(n, 96, seed=n) for n in (256, 64, 128, 200)]
    ms = [W12Matrix.from_bf16(w) for w in ws]
    for group in (ms[:1], [ms[0], ms[2], ms[3]], ms):  # aligned (sub-array concat) and unaligned (re-encode)
        got = concat_rows(group)
        assert torch.equal(bits(got.to_bf16()), bits(torch.cat([m.to_bf16() for m in group])))
    with pytest.raises(ValueError, match="same K"):
        concat_rows([ms[0], W12Matrix.from_bf16(special_matrix(128, 64, seed=1))])
    m = W12Matrix.from_bf16(ws[3])
    for rows, cols in (((0, 128), None), ((128, 200), None), ((10, 150), None), (None, (64, 96)), (None, (5, 70))):
        piece = rank_piece(m, rows, cols)
        r0, r1 = rows or (0, 200)
        c0, c1 = cols or (0, 96)
        assert torch.equal(bits(piece.to_bf16()), bits(ws[3][r0:r1, c0:c1]))
