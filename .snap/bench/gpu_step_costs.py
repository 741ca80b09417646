"""Step costs of a Llama-3.1-8B-shaped target on one GPU, BF16 vs W12: the row-cost curve (issue 12) and
TLV's stage times (issue 11), each forward captured in a CUDA graph and replayed.

Model: `LlamaForCausalLM` with random weights, built as bench/hf_decode.py builds it (its `llama_config`,
N(0, 0.02) init, BF16). BF16 is timed first; then every decoder linear is converted in place with the
project's codec (`W12Matrix.from_bf16`, exact) to a `W12Linear` (runtime/w12_linear.py): exact passes run
`torch.ops.w12.gemm`, the 8-bit view (`view8_mode`) runs `torch.ops.w12.view_gemm`. Embedding and LM head
stay BF16 (as `w12 convert` leaves them). `--share-layers` converts layer 0 once and puts the same W12
modules in all 32 layers (faster; weights are random anyway, and one layer's weights, ~160 MB, are far
larger than the 50 MB L2, so the bytes streamed per step are the same; not the default).

One step = one forward of R rows (tokens at positions ctx + depth) against a static KV cache holding
`ctx` committed tokens (default 512, filled by a real prefill), through all layers + final norm + LM head
+ argmax of every row (what verification needs):

    per layer:  h = rmsnorm(x); q, k, v = h·Wq, h·Wk, h·Wv; RoPE (llama3); K/V rows written to slots
                [ctx, ctx + R) (past the committed rows, which no pass writes: TLV's Q pass leaves the
                committed cache as it was, as specdec/tlv.py's append-then-crop does); attention of the R
                queries over slots [0, ctx + R) with an explicit mask (all committed slots visible; among
                the new rows: causal for the curve, the tree's ancestor mask for the TLV stages), SDPA with
                the query heads grouped per KV head (GQA without copying K/V); o-proj; residual;
                SwiGLU MLP (gate, up, down); residual
    logits = lm_head(rmsnorm(x)); argmax over the vocabulary per row

The forward is written here from the HF modules (norms, linears, rotary embedding, MLP) so that the cache
is a plain static tensor on every Transformers 5.x; it is checked against `model(input_ids).logits`.
HF's Llama runs q/k/v and gate/up as separate GEMMs (7 per layer); a serving engine fuses them.

Timing: warm-up on a side stream, capture, 3 replays, then replays back to back with a CUDA event pair
around each until --min-ms of GPU time and at least --reps replays; median (p10 and p90 also kept).

Measured:
  curve   R ∈ --rows (default 1 2 4 8 16 24 32 48 64 96 128), causal mask: BF16, W12 exact, W12 8-bit view
  tlv     per node budget N ∈ --budgets (16 32 64), R = N + 1 rows (root + N draft nodes):
          q       W12 8-bit view over tree ① (a best-first tree of N nodes from a synthetic 8 × 8 lattice)
          exact   W12 exact over root → C → subtree ② (|C| = --chain, as specdec/tlv.combine builds it)
          single  W12 exact over the single-pass best-first tree of N nodes (same rows as exact)
          single_bf16  the same in BF16
  draft   ASSUMED drafter (label it when used): one target-width decoder layer (the target's layer 0) + the
          LM head over a block of 16 rows, BF16, against the same cache (an EAGLE/DFlash-style single-layer
          block drafter; the paper's DFlash2 drafter cost 1.05 ms = 0.07 of its 14.9 ms exact pass)
  append  KV compaction after acceptance (gather --chain accepted rows to slots [ctx, ctx + τ) in every
          layer), a captured graph; host = argmax rows to the host + `verify.accept` on the tree (Python)

    python bench/gpu_step_costs.py                     # GPU (H200: a few minutes incl. build/convert)
    python bench/gpu_step_costs.py --tiny              # CPU smoke test, eager timing (seconds)
    python bench/gpu_step_costs.py --json costs.json   # default $OUT/gpu-step-costs.json when $OUT is set

Consumers: `RowCurve.from_json(path, kind)` (specdec/batching.py), `bench/batching_sim.py --costs PATH`,
`bench/tlv_projection.py --costs PATH`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_decode import llama_config  # noqa: E402  (the model bench/hf_decode.py builds)

SCHEMA = "w12-gpu-step-costs/1"
ROWS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]
BUDGETS = [16, 32, 64]
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


# --- model and forward -----------------------------------------------------------------------------

def build_model(cfg, device: str, seed: int):
    """Random BF16 Llama as bench/hf_decode.py builds it (N(0, 0.02) init, then cast)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    return model.eval()


class StaticKV:
    """K and V of every layer as [1, kv_heads, capacity, head_dim] tensors that never move."""

    def __init__(self, cfg, capacity: int, device: str, dtype=torch.bfloat16):
        shape = (1, cfg.num_key_value_heads, capacity, head_dim(cfg))
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]


def head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


def forward(model, kv: StaticKV, ids, pos, mask, ctx: int, n_layers: int | None = None):
    """Logits [1, R, V] of R rows at positions `pos`, K/V written to slots [ctx, ctx + R); `mask` is the
    additive [1, 1, G·R, ctx + R] mask of the grouped queries (G = query heads per KV head)."""
    m, R = model.model, ids.shape[1]
    x = m.embed_tokens(ids)
    cos, sin = m.rotary_emb(x, pos)
    cos, sin = cos[:, None], sin[:, None]                       # [1, 1, R, D]
    for i, layer in enumerate(m.layers[:n_layers]):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = (p(h).view(1, R, -1, a.head_dim).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        kv.k[i][:, :, ctx:ctx + R] = k
        kv.v[i][:, :, ctx:ctx + R] = v
        kvh, d = k.shape[1], a.head_dim
        qg = q.reshape(1, kvh, -1, d)                           # query head j·G + g -> row g·R + r of group j
        o = F.scaled_dot_product_attention(qg, kv.k[i][:, :, :ctx + R], kv.v[i][:, :, :ctx + R],
                                           attn_mask=mask, scale=a.scaling)
        x = x + a.o_proj(o.reshape(1, -1, R, d).transpose(1, 2).reshape(1, R, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(m.norm(x))


def group_mask(visible_new: torch.Tensor, ctx: int, groups: int, device, dtype=torch.bfloat16) -> torch.Tensor:
    """[1, 1, G·R, ctx + R] additive mask: committed slots visible, new rows by `visible_new` [R, R] bool.
    Stored with the last dim padded to a multiple of 16 (SDPA's memory-efficient kernel wants aligned rows)."""
    R = visible_new.shape[0]
    vis = torch.cat([torch.ones(R, ctx, dtype=torch.bool), visible_new.cpu()], 1).repeat(groups, 1)
    L = ctx + R
    store = torch.full((groups * R, -(-L // 16) * 16), torch.finfo(dtype).min, dtype=dtype)
    store[:, :L].masked_fill_(vis, 0.0)
    return store.to(device)[None, None, :, :L]


class Pass:
    """Static inputs of one forward of a tree (or chain) of R rows at slots [ctx, ctx + R)."""

    def __init__(self, model, kv, ctx: int, tokens, depths, visible, n_layers: int | None = None):
        cfg, dev = model.config, model.lm_head.weight.device
        self.model, self.kv, self.ctx, self.n_layers = model, kv, ctx, n_layers
        self.ids = torch.as_tensor(tokens, dtype=torch.long).reshape(1, -1).to(dev)
        self.pos = (ctx + torch.as_tensor(depths, dtype=torch.long)).reshape(1, -1).to(dev)
        self.mask = group_mask(visible, ctx, cfg.num_attention_heads // cfg.num_key_value_heads, dev, model.dtype)

    def logits(self):
        return forward(self.model, self.kv, self.ids, self.pos, self.mask, self.ctx, self.n_layers)

    def __call__(self):
        return self.logits()[0].argmax(-1)


def chain_pass(model, kv, ctx: int, R: int, seed: int, n_layers: int | None = None) -> Pass:
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, model.config.vocab_size, (R,), generator=g)
    return Pass(model, kv, ctx, toks, torch.arange(R), torch.ones(R, R, dtype=torch.bool).tril(), n_layers)


def tree_pass(model, kv, ctx: int, tree) -> Pass:
    return Pass(model, kv, ctx, tree.tokens, tree.depths, tree.mask())


@torch.no_grad()
def prefill(model, kv, ctx: int, seed: int) -> None:
    """Fill cache slots [0, ctx) with a real forward of `ctx` random tokens."""
    if ctx:
        chain_pass(model, kv, 0, ctx, seed)()


@torch.no_grad()
def check_forward(model, kv, seed: int, n: int = 48, r: int = 16) -> float:
    """‖ours − HF‖ / ‖HF‖ over the last r logits rows: HF's model(ids) on n + r tokens vs our prefill of n
    + a causal pass of r rows at ctx = n."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, n + r), generator=g).to(model.lm_head.weight.device)
    ref = model(input_ids=ids).logits[0, n:].float()
    Pass(model, kv, 0, ids[0, :n], torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril()).logits()
    ours = Pass(model, kv, n, ids[0, n:], torch.arange(r), torch.ones(r, r, dtype=torch.bool).tril()).logits()[0]
    return rel_err(ours, ref)


def rel_err(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


@torch.no_grad()
def check_semantics(device: str, seed: int) -> float:
    """The same check on the tiny config in float32 on `device`, where any difference is a bug (RoPE,
    cache slots, masks or head grouping) rather than BF16 rounding: both paths run the same modules, only
    the attention kernels differ (a broken RoPE gives ~2e-2 here; CPU runs give 0)."""
    cfg = llama_config(True)
    torch.manual_seed(seed)
    with torch.device(device):
        from transformers import LlamaForCausalLM
        model = LlamaForCausalLM(cfg).float().eval()
    return check_forward(model, StaticKV(cfg, 64, device, torch.float32), seed)


# --- conversion ------------------------------------------------------------------------------------

def _get(root, dotted):
    *path, last = dotted.split(".")
    for p in path:
        root = getattr(root, p)
    return root, last


@torch.no_grad()
def to_w12(model, share_layers: bool) -> dict:
    """Every decoder linear -> W12Linear (exact, `W12Matrix.from_bf16`), in place; BF16 weights freed."""
    from w12.formats.matrix import W12Matrix
    from w12.runtime.w12_linear import W12Linear, prepare

    dev = model.lm_head.weight.device
    first, weights, escapes, w12_bytes, t = {}, 0, 0, 0, time.perf_counter()
    for i, layer in enumerate(model.model.layers):
        for name in LINEARS:
            parent, attr = _get(layer, name)
            lin = getattr(parent, attr)
            if share_layers and i > 0:
                new = first[name]
            else:
                m = W12Matrix.from_bf16(lin.weight.detach().cpu().contiguous())
                new = W12Linear.from_matrix(m, None if lin.bias is None else lin.bias.detach().cpu()).to(dev)
                first.setdefault(name, new)
            weights += lin.weight.numel()
            escapes += new.weight_escapes.shape[0]
            w12_bytes += sum(b.numel() * b.element_size() for b in new.buffers())
            setattr(parent, attr, new)
            del lin
    prepare(model)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"seconds": time.perf_counter() - t, "share_layers": share_layers, "weights": weights,
            "escape_rate": escapes / weights, "w12_bytes": w12_bytes, "bf16_bytes": 2 * weights}


def kernels_live(model) -> bool:
    from w12.runtime.w12_linear import W12Linear, kernel_backend

    mods = [m for m in model.modules() if isinstance(m, W12Linear)]
    return kernel_backend() is not None and all(m._buffers.keys() & {"_w12_packed", "_esc_offsets"} for m in mods)


# --- timing ----------------------------------------------------------------------------------------

def summary(ms: list[float]) -> dict:
    s = sorted(ms)
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]
    return {"ms": statistics.median(s), "p10": q(0.1), "p90": q(0.9), "n": len(s)}


@torch.no_grad()
def time_gpu(fn, reps: int, min_ms: float) -> dict:
    """Median of CUDA-event-timed replays of a graph capturing one call of `fn`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    n = max(reps, min(2000, int(min_ms / 1e3 / max(time.perf_counter() - t, 1e-6))))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    out = summary([a.elapsed_time(b) for a, b in ev])
    del g
    return out


@torch.no_grad()
def time_cpu(fn, reps: int, min_ms: float) -> dict:
    fn()
    ms = []
    for _ in range(max(2, min(reps, 3))):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return summary(ms)


def timer(device: str, reps: int, min_ms: float):
    f = time_gpu if device.startswith("cuda") else time_cpu
    return lambda fn: f(fn, reps, min_ms)


def time_host(fn, n: int = 50) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


# --- TLV shapes ------------------------------------------------------------------------------------

def tlv_trees(budget: int, chain: int, seed: int, vocab: int):
    """(tree ①, the exact pass's combined tree, the single-pass tree): best-first trees of `budget` nodes
    from synthetic 8-position × top-8 lattices; combined = root → C (|C| = chain) → subtree ②."""
    from w12.specdec.lattice import Lattice
    from w12.specdec.tlv import combine
    from w12.specdec.trees import best_first

    g = torch.Generator().manual_seed(seed)
    lat = lambda: Lattice.from_logits(torch.randn(8, min(vocab, 4096), generator=g) * 3, 8)
    tree1 = best_first(lat(), 1, budget)
    C = [2 + i for i in range(min(chain, budget))]
    sub = best_first(lat(), C[-1], budget - len(C)) if budget > len(C) else None
    full = combine(C, 1, sub)
    if not len(tree1) == len(full) == budget + 1:
        raise RuntimeError(f"trees of {len(tree1)} / {len(full)} rows for budget {budget}")
    return tree1, full, tree1


def compact_fn(kv: StaticKV, ctx: int, rows: list[int], device):
    """Keep the accepted rows: slots ctx + rows -> [ctx, ctx + len(rows)) in every layer (engine.keep_rows)."""
    idx = torch.tensor([ctx + r for r in rows], device=device)
    n = len(rows)

    def fn():
        for k, v in zip(kv.k, kv.v):
            k[:, :, ctx:ctx + n] = k.index_select(2, idx)
            v[:, :, ctx:ctx + n] = v.index_select(2, idx)
    return fn


def host_ms(tree, device) -> float:
    """Argmax of every row to the host + greedy acceptance walk (verify.accept), per pass."""
    from w12.specdec.verify import accept

    nxt = torch.zeros(len(tree), dtype=torch.long, device=device)

    def fn():
        accept(tree, nxt.tolist())
    return time_host(fn)


# --- the run ---------------------------------------------------------------------------------------

def write(doc: dict, path: str | None) -> None:
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)


def measure_curve(kind: str, model, kv, ctx, rows, T, seed) -> list[dict]:
    out = []
    for R in rows:
        r = T(chain_pass(model, kv, ctx, R, seed + R))
        out.append(r)
        log(f"{kind} R={R}: {r['ms']:.3f} ms")
    return out


def run(args) -> dict:
    device = args.device or ("cpu" if args.tiny else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --tiny for the CPU smoke test")
    rows, budgets = args.rows, args.budgets
    if args.tiny:
        rows, budgets, args.ctx = [r for r in rows if r <= 16], [b for b in budgets if b <= 16], min(args.ctx, 64)
    cfg = llama_config(args.tiny)
    T = timer(device, args.reps, args.min_ms)
    doc = {"schema": SCHEMA, "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
           "model": "tiny-llama" if args.tiny else "llama-3.1-8b-shaped (random weights)",
           "torch": torch.__version__, "transformers": __import__("transformers").__version__,
           "triton": _version("triton"), "ctx": args.ctx, "tiny": args.tiny,
           "timing": ("CUDA graph of one forward, replays timed by CUDA events, median" if device.startswith("cuda")
                      else "eager CPU forwards, perf_counter, median (smoke test, not a measurement)"),
           "step": "embed + 32 layers (HF modules; SDPA with explicit mask) + norm + LM head + argmax of every row",
           "curve_mask": "causal over the R new rows; all ctx committed slots visible",
           "curve_note": ("one sequence: the R rows share one KV cache of ctx tokens; B requests' separate caches add "
                          "B·ctx·128 KiB of K/V reads per step (Llama-3.1-8B shape), not in this curve"),
           "tlv_mask": "tree ancestor mask (specdec Tree.mask) over the R new rows; all ctx committed slots visible"}
    doc["check"] = {"semantics_fp32_rel_err": check_semantics(device, args.seed)}
    if doc["check"]["semantics_fp32_rel_err"] > 1e-3:
        raise RuntimeError(f"our forward disagrees with HF's on the tiny fp32 model: {doc['check']}")
    log(f"building {doc['model']} on {device}")
    model = build_model(cfg, device, args.seed)
    kv = StaticKV(cfg, max(args.ctx + max(rows + [b + 1 for b in budgets] + [args.draft_rows]), 64), device)
    doc["check"]["forward_vs_hf_rel_err"] = check_forward(model, kv, args.seed)
    log(f"forward vs HF: rel err {doc['check']['forward_vs_hf_rel_err']:.2e}")
    if doc["check"]["forward_vs_hf_rel_err"] > 0.1:
        raise RuntimeError(f"our forward disagrees with HF's: {doc['check']}")
    prefill(model, kv, args.ctx, args.seed)
    probe = chain_pass(model, kv, args.ctx, 16, args.seed + 999)
    with torch.no_grad():
        ref = probe.logits().float()
    curve = {"rows": rows, "bf16": measure_curve("bf16", model, kv, args.ctx, rows, T, args.seed)}
    trees = {N: tlv_trees(N, args.chain, args.seed + N, cfg.vocab_size) for N in budgets}
    tlv = {N: {"rows": N + 1, "single_bf16": T(tree_pass(model, kv, args.ctx, trees[N][2]))} for N in budgets}
    draft = T(chain_pass(model, kv, args.ctx, args.draft_rows, args.seed + 7, n_layers=1))
    log(f"drafter proxy: {draft['ms']:.3f} ms")
    append = {N: T(compact_fn(kv, args.ctx, list(range(1, min(args.chain, N) + 1)), device)) for N in budgets}
    host = {N: host_ms(trees[N][1], device) for N in budgets}
    write(_doc(doc, curve, tlv, draft, append, host, args), args.json)

    log("converting to W12")
    doc["convert"] = to_w12(model, args.share_layers)
    log(f"converted in {doc['convert']['seconds']:.1f} s, escape rate {doc['convert']['escape_rate']:.2e}")
    doc["check"]["kernels"] = kernels_live(model)
    if device.startswith("cuda") and not doc["check"]["kernels"]:
        raise RuntimeError("torch.ops.w12 kernels are not in use: timings would be of the decode fallback")
    from w12.runtime.w12_linear import view8_mode
    with torch.no_grad():
        doc["check"]["w12_vs_bf16_rel_err"] = rel_err(probe.logits(), ref)
        with view8_mode(model):
            doc["check"]["view_vs_bf16_rel_err"] = rel_err(probe.logits(), ref)
    log(f"checks: {doc['check']}")
    curve["w12"] = measure_curve("w12", model, kv, args.ctx, rows, T, args.seed)
    for N in budgets:
        tlv[N]["exact"] = T(tree_pass(model, kv, args.ctx, trees[N][1]))
        tlv[N]["single"] = T(tree_pass(model, kv, args.ctx, trees[N][2]))
    with view8_mode(model):
        curve["view"] = measure_curve("view", model, kv, args.ctx, rows, T, args.seed)
        for N in budgets:
            tlv[N]["q"] = T(tree_pass(model, kv, args.ctx, trees[N][0]))
            log(f"TLV N={N}: Q {tlv[N]['q']['ms']:.3f} ms, exact {tlv[N]['exact']['ms']:.3f} ms, "
                f"single {tlv[N]['single']['ms']:.3f} ms (BF16 {tlv[N]['single_bf16']['ms']:.3f} ms)")
    doc = _doc(doc, curve, tlv, draft, append, host, args)
    doc["wall_s"] = time.perf_counter() - T0
    write(doc, args.json)
    return doc


def _version(name):
    try:
        return __import__(name).__version__
    except Exception:
        return None


def _doc(doc, curve, tlv, draft, append, host, args) -> dict:
    """The JSON layout the consumers read: times in ms (medians), spreads alongside."""
    out = dict(doc)
    out["curve"] = {"rows": curve["rows"],
                    **{f"{k}_ms": [r["ms"] for r in curve[k]] for k in ("bf16", "w12", "view") if k in curve},
                    "spread": {k: curve[k] for k in ("bf16", "w12", "view") if k in curve}}
    out["tlv"] = {
        "chain": args.chain,
        "draft_ms": draft["ms"],
        "draft_assumption": (f"ASSUMED drafter: one target-width decoder layer + the LM head over {args.draft_rows} "
                             "rows, BF16, against the same cache (EAGLE/DFlash-style single-layer block drafter)"),
        "budgets": {str(N): {"rows": v["rows"],
                             **{f"{k}_ms": v[k]["ms"] for k in ("q", "exact", "single", "single_bf16") if k in v},
                             "append_ms": append[N]["ms"], "host_ms": host[N],
                             "spread": {k: v[k] for k in ("q", "exact", "single", "single_bf16") if k in v}}
                    for N, v in tlv.items()},
        "append_what": f"KV compaction of {args.chain} accepted rows in every layer (captured graph)",
        "host_what": "argmax rows to the host + verify.accept walk, per pass (Python)",
    }
    return out


def markdown(doc: dict) -> str:
    c = doc["curve"]
    L = [f"Step costs, {doc['model']}, ctx {doc['ctx']}, {doc['device']} ({doc['timing']})", "",
         "| rows R | BF16 ms | W12 ms | view ms | W12 / BF16 | view / W12 |", "|---|---|---|---|---|---|"]
    for i, R in enumerate(c["rows"]):
        b, w, v = (c.get(f"{k}_ms", [float("nan")] * len(c["rows"]))[i] for k in ("bf16", "w12", "view"))
        L.append(f"| {R} | {b:.3f} | {w:.3f} | {v:.3f} | {w / b:.3f} | {v / w:.3f} |")
    t = doc["tlv"]
    L += ["", "| N | rows | Q (view) ms | exact ms | single-pass ms | single BF16 ms | Q / exact | append ms | host ms |",
          "|---|---|---|---|---|---|---|---|---|"]
    for N, s in t["budgets"].items():
        q, e = s.get("q_ms", float("nan")), s.get("exact_ms", float("nan"))
        L.append(f"| {N} | {s['rows']} | {q:.3f} | {e:.3f} | {s.get('single_ms', float('nan')):.3f} | "
                 f"{s['single_bf16_ms']:.3f} | {q / e:.3f} | {s['append_ms']:.3f} | {s['host_ms']:.3f} |")
    L += ["", f"Drafter: {t['draft_ms']:.3f} ms — {t['draft_assumption']}.", f"Checks: {doc['check']}.",
          f"Convert: {json.dumps(doc.get('convert'))}.", f"Wall: {doc.get('wall_s', float('nan')):.0f} s."]
    return "\n".join(L)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU (smoke test)")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    ap.add_argument("--json", default=None, help="output JSON (default $OUT/gpu-step-costs.json when $OUT is set)")
    ap.add_argument("--ctx", type=int, default=512, help="committed tokens in the KV cache")
    ap.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=ROWS)
    ap.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=BUDGETS)
    ap.add_argument("--chain", type=int, default=2, help="|C| of the exact pass's tree, and accepted rows compacted")
    ap.add_argument("--draft-rows", type=int, default=16)
    ap.add_argument("--share-layers", action="store_true", help="convert layer 0 once, use it in every layer")
    ap.add_argument("--reps", type=int, default=20, help="at least this many timed replays")
    ap.add_argument("--min-ms", type=float, default=250.0, help="and at least this much GPU time per measurement")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.json is None and os.environ.get("OUT"):
        args.json = os.path.join(os.environ["OUT"], "gpu-step-costs.json")
    doc = run(args)
    print(markdown(doc))
    return doc


if __name__ == "__main__":
    main()
