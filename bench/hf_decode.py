"""BF16 vs W12 greedy decoding through stock Transformers (static cache + torch.compile), one run.

A Llama-3.1-8B-shaped model with random weights is saved as BF16, converted with `w12 convert`, and both
checkpoints are loaded with `from_pretrained` (after `w12.patch_transformers()`). Each decodes the same
64-token prompt for 256 new tokens, batch 1, greedy, `cache_implementation="static"` with the default
CompileConfig (inductor, CUDA graphs). Reported: decode tokens/s of each, the W12/BF16 ratio, and token
agreement (W12's fused kernel accumulates in another order than cuBLAS, so a random model's argmax may
flip at near-ties; the index of the first differing token is printed).

    python bench/hf_decode.py                     # GPU: the real measurement (needs ~45 GB of disk)
    python bench/hf_decode.py --tiny              # CPU smoke test of the whole pipeline (seconds)
    python bench/hf_decode.py --json out.json     # also write the figures as JSON
    python bench/hf_decode.py --fuse both         # W12 with and without fused q/k/v, gate/up GEMMs

W12 fuses sibling projections (q/k/v and gate/up: one GEMM each, runtime/fused.py) on CUDA by default;
`--fuse off` loads it with W12_FUSE=0 (7 GEMMs per layer), `--fuse both` measures both. The JSON gives
each W12 run's `fuse` switch and `fused_groups` (0 on the CPU, where nothing is fused).

The LM head is converted too (`--lm-head w12`, the default: the untied head is an ordinary lossless W12
matrix; `--lm-head bf16` keeps the converter's default exclude).

Each model is loaded and compiled in its own process (one torch.compile cache each; the processes do that side
by side), then the processes are timed in rounds that take turns (BF16, W12, BF16, …; `--repeats` rounds,
default 5), so whatever the machine does meanwhile hits both sides alike (`--sequential`: one model after the
other, each alone); each model's figure is the median of its rounds and `round_ratios` gives W12/BF16 per round.
A process's host speed differs from another's for the same code (up to ~10 % of a token's time, measured), which
rounds within one process cannot average out: `--pairs P` runs P process sets one after the other (each loads
and compiles afresh, from the warm inductor cache after the first; W12 first in every other set) and pools their
rounds; `pairs` and `median_pair_speedup` give each set's own figures (`--pin`: each worker's generate thread on
a CPU of its own after the warm-up). A set's load and compile took 210–360 s on the H200 host (the host's speed
varies by day): more sets than one per 600 s device call need `--workdir DIR --keep`, then `--reuse` in the next.
A round's rate is (new_tokens − 1) / (t(new_tokens) − t(1)): the prefill and the first token are subtracted, so
the figure is the steady per-token rate. Each round times two harnesses: generate(max_new_tokens=n, min_new_tokens=n)
(`decode_tok_s`, `speedup_w12_over_bf16`: the exact length guaranteed by a logits processor that runs every
step) and plain generate(max_new_tokens=n) as users call it (`decode_tok_s_plain`,
`speedup_w12_over_bf16_plain_generate`; a round that stopped at EOS before n tokens counts as NaN). The plain one is
the decode figure the README quotes: it is the harness as specified (256 new tokens, greedy, static cache, the
default CompileConfig) with nothing added; the min_new_tokens one adds host work to every step on both sides, which
dilutes the ratio by the host's speed (bench/results/2026-12-02-hf-decode-h200-s16.md).
On CUDA each run also reports `gemm_us_per_token`:
the projections of one token (q/k/v, o, gate/up, down per layer, and the LM head) replayed in CUDA graphs at
batch 1, and `other_us_per_token`: the rest of a token's time (attention, norms, rotary, sampling, gaps);
`round_gpu` (`--gpu-sample`): the SM clock and power nvidia-smi saw during each round (a diagnostic of round-to-round
spread; off by default since session 14: in four runs it never saw a clock below 1980 MHz; the poll itself does not
slow a replay-and-synchronise loop, bench/results/2026-12-02-host-probe-h200-s14.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def llama_config(tiny: bool):
    from transformers import LlamaConfig

    if tiny:
        return LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                           rope_theta=500000.0, tie_word_embeddings=False)
    return LlamaConfig(  # meta-llama/Llama-3.1-8B
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})


def w12_dirname(lm_head: str) -> str:
    return "w12" if lm_head == "w12" else "w12-bf16-lm-head"


def build_checkpoints(cfg, workdir: str, device: str, seed: int, lm_head: str = "w12") -> tuple[str, str]:
    """Random BF16 model (built on `device`, N(0, 0.02) weights) -> workdir/bf16, converted -> workdir/w12
    (lm_head="w12": `w12 convert --exclude '*embed*'`, the untied LM head converted too; "bf16": the
    converter's default exclude, LM head kept in BF16)."""
    from transformers import LlamaForCausalLM

    from w12.convert.convert import DEFAULT_EXCLUDE, Options, convert

    bf16_dir, w12_dir = os.path.join(workdir, "bf16"), os.path.join(workdir, w12_dirname(lm_head))
    torch.manual_seed(seed)
    t = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(bf16_dir)
    del model
    gc.collect()
    print(f"built and saved the BF16 checkpoint in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    t = time.perf_counter()
    exclude = ("*embed*",) if lm_head == "w12" else DEFAULT_EXCLUDE
    convert(bf16_dir, w12_dir, Options(exclude=exclude), overwrite=True)
    print(f"converted to W12 in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return bf16_dir, w12_dir


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def load(path: str, device: str, fuse: bool | None):
    """from_pretrained with W12_FUSE set for the load when `fuse` is given (restored afterwards)."""
    from transformers import AutoModelForCausalLM

    old = os.environ.get("W12_FUSE")
    if fuse is not None:
        os.environ["W12_FUSE"] = "1" if fuse else "0"
    try:
        return AutoModelForCausalLM.from_pretrained(path, device_map=device)
    finally:
        if old is None:
            os.environ.pop("W12_FUSE", None)
        else:
            os.environ["W12_FUSE"] = old


def storage_bytes(model) -> int:
    """Bytes of the distinct storages behind parameters and buffers (fused groups' views counted once)."""
    seen = {}
    for t in list(model.parameters()) + list(model.buffers()):
        s = t.untyped_storage()
        seen[(t.device, s.data_ptr())] = s.nbytes()
    return sum(seen.values())


# one decode step's projections, in call order per decoder layer (siblings that share an input run together,
# so a fused W12 group runs its one GEMM), then the LM head
UNITS = (("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")), ("o", ("self_attn.o_proj",)),
         ("gate_up", ("mlp.gate_proj", "mlp.up_proj")), ("down", ("mlp.down_proj",)))


def gemm_breakdown(model, reps: int = 5) -> dict:
    """µs per generated token spent in the projections at batch 1, by kind and in total: every layer's
    modules called once on a random bf16 row, captured in one CUDA graph per kind (weights read cold from
    HBM as in decoding, no L2 flush needed: one layer's weights exceed the L2), median of `reps` replays."""
    layers = model.model.layers
    hidden = model.config.hidden_size
    x = torch.randn(1, 1, hidden, device="cuda").to(torch.bfloat16)
    xd = torch.randn(1, 1, model.config.intermediate_size, device="cuda").to(torch.bfloat16)

    def calls(kind, names):
        if kind == "lm_head":
            return [lambda: model.lm_head(x)]
        inp = xd if kind == "down" else x
        return [lambda layer=layer: [layer.get_submodule(n)(inp) for n in names] for layer in layers]

    out = {}
    with torch.no_grad():
        for kind, names in UNITS + (("lm_head", ()),):
            fns = calls(kind, names)
            for f in fns:  # warm up outside the capture
                f()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for f in fns:
                    f()
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            out[kind] = sorted(times)[reps // 2]
            del graph
    out["total"] = sum(out.values())
    return out


class GuardProbe:
    """While active, times the guard tree of every frame torch.compile builds: torch's own
    `profile_guard_manager` on the frame's locals at build time (checked to pass first), µs per evaluation,
    median and min of 31 × 300; plus the guards by kind. The guard check runs before every compiled decode
    step, on the host, in series with the GPU (generate synchronises every token). A diagnostic: where this
    torch lacks the hook, `frames` stays empty."""

    def __enter__(self):
        import collections
        import re

        import torch._dynamo.guards as dg

        self.frames, self._dg = [], dg
        self._old = getattr(dg, "guard_manager_testing_hook_fn", None)

        def hook(manager, scope, builder):
            try:
                from torch._C._dynamo.guards import profile_guard_manager

                if not manager.check(scope):
                    raise RuntimeError("the guards fail on their own frame")
                vals = sorted(profile_guard_manager(manager.root, scope, 300) for _ in range(31))
            except Exception as e:  # a diagnostic: never fail the compile
                self.frames.append({"error": f"{type(e).__name__}: {e}"[:200]})
                return
            kinds = collections.Counter(re.findall(r"\+- ([A-Z_]+):", str(manager)))
            self.frames.append({"median_us": vals[15], "min_us": vals[0], "guards": dict(kinds)})

        if hasattr(dg, "guard_manager_testing_hook_fn"):
            dg.guard_manager_testing_hook_fn = hook
        return self

    def __exit__(self, *exc):
        if hasattr(self._dg, "guard_manager_testing_hook_fn"):
            self._dg.guard_manager_testing_hook_fn = self._old


class Entry:
    """One loaded, compiled model and its measurements (load and warm-up at creation, timed rounds later)."""

    def __init__(self, path: str, device: str, prompt: torch.Tensor, new_tokens: int, compile_config,
                 fuse: bool | None = None):
        from w12.runtime.fused import fused_groups

        self.device, self.new_tokens = device, new_tokens
        cuda = device.startswith("cuda")
        if cuda:
            sync(device)
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t = time.perf_counter()
        self.model = load(path, device, fuse)
        load_s = time.perf_counter() - t
        self.ids = prompt.to(device)
        self.kw = dict(attention_mask=torch.ones_like(self.ids), do_sample=False, cache_implementation="static",
                       pad_token_id=0, compile_config=compile_config)
        self.rates, self.rates_plain, self.plain_same, self.tokens = [], [], True, None
        t = time.perf_counter()
        with GuardProbe() as probe:
            self.tokens = self.gen(0)[0]  # compile + warm-up (the timed runs reuse the same static cache shape)
        warm_s = time.perf_counter() - t  # includes the probe's ~10 k guard evaluations
        self.res = {"path": path, "fuse": fuse, "fused_groups": fused_groups(self.model), "load_s": load_s,
                    "warmup_s": warm_s, "weights_and_buffers_bytes": storage_bytes(self.model),
                    "max_cuda_mem_bytes": torch.cuda.max_memory_allocated() - before if cuda else None,
                    "compiled": getattr(self.model, "_compiled_call", None) is not None,
                    "guard_frames": probe.frames}

    def gen(self, n: int, force: bool = True):
        """generate n new tokens (0: the entry's full length), synchronised; (tokens, seconds). force: also
        min_new_tokens=n (a logits processor that masks EOS until n tokens; without it the EOS check stays and a
        random model's argmax hardly ever hits EOS, which timed_round checks)."""
        n = n or self.new_tokens
        sync(self.device)
        t0 = time.perf_counter()
        out = self.model.generate(self.ids, max_new_tokens=n, **({"min_new_tokens": n} if force else {}), **self.kw)
        sync(self.device)
        return out[0, self.ids.shape[1]:].tolist(), time.perf_counter() - t0

    def _rate(self, new_tokens: int, force: bool) -> tuple:
        """(tokens, (new_tokens − 1) / (t(new_tokens) − t(1))); NaN when it stopped before new_tokens."""
        toks, full = self.gen(new_tokens, force)
        _, first = self.gen(1, force)
        ok = len(toks) == new_tokens and full > first
        return toks, (new_tokens - 1) / (full - first) if ok else float("nan")

    def timed_round(self, new_tokens: int) -> tuple:
        """One decode-rate sample of each harness: with min_new_tokens (the rounds' `round_tok_s`) and plain
        generate(max_new_tokens) (`round_tok_s_plain`)."""
        self.tokens, rate = self._rate(new_tokens, True)
        plain, rate_plain = self._rate(new_tokens, False)
        self.plain_same &= plain == self.tokens
        self.rates.append(rate)
        self.rates_plain.append(rate_plain)
        return rate, rate_plain

    def profile(self, new_tokens: int = 33) -> dict:
        """torch.profiler over generate(new_tokens) and generate(1): per decode step, the wall time, the time
        the GPU was busy (union of kernel and copy intervals), and the kernels that took the most of it."""
        from torch.profiler import ProfilerActivity, profile

        def run(n):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                _, secs = self.gen(n)
            spans, by_name = [], {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
                    spans.append((e.time_range.start, e.time_range.end))
                    by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us()
            busy, end = 0.0, float("-inf")
            for a, b in sorted(spans):
                busy += max(0.0, b - max(a, end))
                end = max(end, b)
            avg = prof.key_averages()
            cpu = {a.key: a.self_cpu_time_total for a in avg}
            cpu.update({f"calls: {a.key}": a.count for a in avg})
            return secs * 1e6, busy, by_name, len(spans), cpu

        w1, b1, k1, c1, h1 = run(1)
        wn, bn, kn, cn, hn = run(new_tokens)
        steps = new_tokens - 1

        def top(now, before, count=12, calls=False):
            d = sorted(((v - before.get(k, 0.0)) / steps, k) for k, v in now.items()
                       if k.startswith("calls: ") == calls)[::-1][:count]
            return [[round(v, 1), k[:90]] for v, k in d]

        return {"wall_us_per_step": (wn - w1) / steps, "gpu_busy_us_per_step": (bn - b1) / steps,
                "gpu_events_per_step": (cn - c1) / steps, "top_kernels_us_per_step": top(kn, k1),
                "top_host_self_us_per_step": top(hn, h1, 20), "top_host_calls_per_step": top(hn, h1, 20, True)}

    def finish(self) -> dict:
        """The entry's result (median rate over its rounds, the projections' breakdown); frees the model."""
        res = dict(self.res, decode_tok_s=_median(self.rates), round_tok_s=self.rates,
                   decode_tok_s_plain=_median(self.rates_plain),
                   round_tok_s_plain=self.rates_plain, plain_generate_same_tokens=self.plain_same)
        if self.device.startswith("cuda"):  # where a token's time goes: projections vs everything else
            try:
                res["gemm_us_per_token"] = gemm_breakdown(self.model)
                res["other_us_per_token"] = 1e6 / res["decode_tok_s"] - res["gemm_us_per_token"]["total"]
            except Exception as e:  # a diagnostic: the decode figures above stand without it
                res["gemm_us_per_token"] = f"failed: {type(e).__name__}: {e}"[:300]
        res["tokens"] = self.tokens
        del self.model
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        return res


def compile_config(backend: str):
    from transformers import CompileConfig

    cc = CompileConfig(backend=backend) if backend != "inductor" else CompileConfig()
    cc._compile_all_devices = True  # lets the CPU smoke test take the compiled path too
    return cc


def _worker(conn, path, device, prompt, new_tokens, backend, skip_guards, fuse, cpu=None):
    """One model in its own process (its own torch.compile caches: two models compiled in one process
    slowed both by ~20 %, measured), driven over a pipe: ("round", n) | ("profile", None) | ("finish", None).
    skip_guards: after the warm-up, torch.compiler.set_stance(skip_guard_eval_unsafe=True). cpu: after the
    warm-up, the thread that runs generate is pinned to that CPU (no migration between rounds; the compile's
    worker threads and processes keep every CPU)."""
    import traceback

    try:
        import w12

        w12.patch_transformers()
        e = Entry(path, device, prompt, new_tokens, compile_config(backend), fuse)
        if skip_guards:  # warmed up: the decode graph is the only compiled artifact, nothing to tell apart
            torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})  # pid 0: the calling thread only
        conn.send(("ok", None))
        while True:
            cmd, arg = conn.recv()
            out = e.timed_round(arg) if cmd == "round" else e.profile() if cmd == "profile" else e.finish()
            conn.send(("ok", out))
            if cmd == "finish":
                return
    except Exception:
        conn.send(("error", traceback.format_exc()))


class GpuSampler:
    """While active, `nvidia-smi` (its own process, so the timed workers' host loops are not disturbed) samples
    the GPU's SM clock and power every 50 ms: a diagnostic of what moves a round's rate besides the host.
    `summary()` is None where nvidia-smi is missing or printed nothing."""

    def __init__(self, enabled: bool):
        self.enabled, self.proc, self.out = enabled, None, ""

    def __enter__(self):
        gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        if self.enabled:
            try:
                self.proc = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50",
                     "-i", gpu if gpu.isdigit() else "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.proc = None
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.out = self.proc.communicate(timeout=10)[0]

    def summary(self) -> dict | None:
        rows = []
        for line in self.out.splitlines():
            try:
                rows.append([float(v) for v in line.split(",")])
            except ValueError:
                continue
        if not rows:
            return None
        sm, watts = [r[0] for r in rows], [r[1] for r in rows]
        return {"samples": len(rows), "sm_mhz_min": min(sm), "sm_mhz_median": statistics.median(sm),
                "power_w_median": statistics.median(watts)}


class Remote:
    """An Entry living in a worker process (spawned; it loads and compiles at once, `ready()` waits for that)."""

    def __init__(self, name, *args):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.name, (self.conn, child) = name, ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, *args), daemon=True)
        self.proc.start()

    def ready(self):
        self._get()

    def _get(self):
        status, out = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.name} worker failed:\n{out}")
        return out

    def call(self, cmd, arg=None):
        self.conn.send((cmd, arg))
        return self._get()

    def finish(self) -> dict:
        res = self.call("finish")
        self.proc.join(timeout=60)
        return res


def worker_cpus(count: int) -> list:
    """CPUs for the timed workers' generate threads: the last `count` CPUs this process may use (the parent,
    nvidia-smi and the rest keep the others); [None] * count where there are fewer than count + 2."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return cpus[-count:] if len(cpus) >= count + 2 else [None] * count


def run_group(group, specs, common, args, device) -> dict:
    """Load and compile the models of `group` side by side (one process each), time them in `args.repeats`
    rounds that take turns in `group`'s order, and return {name: Entry.finish() result + round_gpu}."""
    cpus = worker_cpus(len(group)) if args.pin else [None] * len(group)
    entries = {n: Remote(n, specs[n][0], *common, specs[n][1], cpu) for n, cpu in zip(group, cpus)}
    t = time.perf_counter()
    for e in entries.values():
        e.ready()
    print(f"loaded and compiled {', '.join(group)} in {time.perf_counter() - t:.0f} s (generate threads on CPUs "
          f"{cpus})", file=sys.stderr)
    gpu_rounds = {}
    for r in range(args.repeats):
        line = {}
        for name, e in entries.items():
            with GpuSampler(args.gpu_sample and device.startswith("cuda")) as gpu:
                line[name] = e.call("round", args.new_tokens)
            gpu_rounds.setdefault(name, []).append(gpu.summary())
        print(f"round {r}: " + ", ".join(
            f"{k} {v[0]:.1f} tok/s (plain generate {v[1]:.1f})"
            + (f" SM {g['sm_mhz_min']:.0f}–{g['sm_mhz_median']:.0f} MHz {g['power_w_median']:.0f} W"
               if (g := gpu_rounds[k][-1]) else "") for k, v in line.items()), file=sys.stderr)
    profiles = {name: e.call("profile") for name, e in entries.items()} if args.profile else {}
    for name, prof in profiles.items():
        print(f"profile {name}: {json.dumps(prof)}", file=sys.stderr)
    done = {}
    for name, e in entries.items():
        done[name] = e.finish()
        done[name]["round_gpu"] = gpu_rounds.get(name)  # SM clock (min, median) and power per round
        if name in profiles:
            done[name]["profile"] = profiles[name]
    return done


def pair_figures(done: dict) -> dict:
    """One process set's medians and W12/BF16 ratios (the figures a single-pair run reports)."""
    b, w = done["bf16"], done["w12"]
    return {"bf16_tok_s": b["decode_tok_s"], "w12_tok_s": w["decode_tok_s"],
            "speedup": w["decode_tok_s"] / b["decode_tok_s"],
            "speedup_plain_generate": w["decode_tok_s_plain"] / b["decode_tok_s_plain"],
            "median_round_ratio": _median([x / y for x, y in zip(w["round_tok_s"], b["round_tok_s"])]),
            "other_us_per_token": {n: done[n].get("other_us_per_token") for n in ("bf16", "w12")}}


POOLED = ("round_tok_s", "round_tok_s_plain", "round_gpu")


def pool(results: list) -> dict:
    """One model's results over several process sets: the first set's result with the rounds of all sets
    (medians recomputed over them) and `per_pair`: each set's own medians and breakdown."""
    out = dict(results[0])
    for key in POOLED:
        out[key] = [v for r in results for v in (r.get(key) or [])]
    out["decode_tok_s"], out["decode_tok_s_plain"] = _median(out["round_tok_s"]), _median(out["round_tok_s_plain"])
    out["plain_generate_same_tokens"] = all(r["plain_generate_same_tokens"] for r in results)
    if len(results) > 1:
        out["per_pair"] = [{k: r.get(k) for k in ("decode_tok_s", "decode_tok_s_plain", "gemm_us_per_token",
                                                   "other_us_per_token")} for r in results]
        if isinstance(out.get("gemm_us_per_token"), dict):
            out["other_us_per_token"] = 1e6 / out["decode_tok_s"] - out["gemm_us_per_token"]["total"]
    return out


def _median(values):  # of the finite values (a plain-generate round that stopped early is NaN)
    return statistics.median([v for v in values if v == v] or [float("nan")])


def _max(values):
    return max([v for v in values if v == v] or [float("nan")])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU (eager compile backend)")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed rounds per model; the loaded models take turns round by round and each keeps its "
                         "median rate (so machine noise hits both sides alike)")
    ap.add_argument("--workdir", default=None, help="where the checkpoints go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints in --workdir")
    ap.add_argument("--reuse", action="store_true", help="reuse workdir/bf16 and workdir/w12 if present")
    ap.add_argument("--compile-backend", default=None, help="CompileConfig backend (default inductor; eager with --tiny)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the result to this file")
    ap.add_argument("--fuse", choices=("on", "off", "both"), default="on",
                    help="W12 with fused q/k/v and gate/up GEMMs (on, the default on CUDA), without (off), or both")
    ap.add_argument("--lm-head", choices=("w12", "bf16"), default="w12",
                    help="convert the (untied) LM head too (w12, the default: lossless, so nothing argues against "
                         "it) or keep it BF16 (the converter's default exclude, which SGLang's loader needs)")
    ap.add_argument("--pairs", type=int, default=1,
                    help="process sets: each loads, compiles and times the models afresh (--repeats rounds), the "
                         "W12 process first in every other set; the figures pool the rounds of all sets and "
                         "`pairs` gives each set's own (a process's host speed varies by up to ~10 %% for the same "
                         "code: only fresh processes average that out)")
    ap.add_argument("--gpu-sample", action="store_true",
                    help="diagnostic: nvidia-smi samples the SM clock and power every 50 ms during each round "
                         "(round_gpu)")
    ap.add_argument("--pin", action="store_true",
                    help="after the warm-up, pin each worker's generate thread to a CPU of its own (measured on the "
                         "H200 host, 2026-12-02: no steadier, slightly slower on both sides; off by default)")
    ap.add_argument("--sequential", action="store_true",
                    help="load and time one model after the other (each alone on the machine) instead of alternating")
    ap.add_argument("--skip-guard-eval", action="store_true",
                    help="diagnostic, both models: after the warm-up, torch.compiler.set_stance(skip_guard_eval_unsafe="
                         "True), i.e. no guard check before each decode step (shows what the check costs each side)")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed rounds, torch.profiler per model: wall vs GPU-busy µs per decode step and "
                         "the kernels that take the most (where the non-projection time goes)")
    args = ap.parse_args(argv)

    device = args.device or ("cpu" if args.tiny else "cuda")
    if args.tiny:
        args.new_tokens = min(args.new_tokens, 8)
        args.prompt_tokens = min(args.prompt_tokens, 16)
        args.repeats = 1
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --tiny for the CPU smoke test")
    backend = args.compile_backend or ("eager" if device == "cpu" else "inductor")

    cfg = llama_config(args.tiny)
    workdir = args.workdir or tempfile.mkdtemp(prefix="w12-hf-decode-")
    os.makedirs(workdir, exist_ok=True)
    try:
        w12_name = w12_dirname(args.lm_head)
        have = all(os.path.exists(os.path.join(workdir, d, "config.json")) for d in ("bf16", w12_name))
        if args.reuse and have:
            bf16_dir, w12_dir = os.path.join(workdir, "bf16"), os.path.join(workdir, w12_name)
        else:
            bf16_dir, w12_dir = build_checkpoints(cfg, workdir, device, args.seed, args.lm_head)
        gen = torch.Generator().manual_seed(args.seed + 1)
        prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt_tokens), generator=gen)
        common = (device, prompt, args.new_tokens, backend, args.skip_guard_eval)
        specs = {"bf16": (bf16_dir, None), "w12": (w12_dir, args.fuse != "off")}
        if args.fuse == "both":
            specs["w12_unfused"] = (w12_dir, False)
        groups = [[n] for n in specs] if args.sequential else [list(specs)]
        pairs = []  # per process set: {name: finished result}
        for p in range(args.pairs):
            done = {}
            for group in groups:  # all models at once (rounds alternate), or one after the other
                done.update(run_group(group[::-1] if p % 2 else group, specs, common, args, device))
            pairs.append(done)
            if args.json and args.pairs > 1:  # what a timeout would otherwise lose
                with open(args.json + ".partial", "w") as f:
                    json.dump({"pairs_done": p + 1, "pairs": [pair_figures(d) for d in pairs]}, f, indent=2)
        bf16, w12r, unfused = (pool([d[n] for d in pairs]) if n in pairs[0] else None
                               for n in ("bf16", "w12", "w12_unfused"))
        ratios = [w / b for w, b in zip(w12r["round_tok_s"], bf16["round_tok_s"])]
        ratios_plain = [w / b for w, b in zip(w12r["round_tok_s_plain"], bf16["round_tok_s_plain"])]
    finally:
        if not (args.keep or args.workdir):
            shutil.rmtree(workdir, ignore_errors=True)

    a, b = bf16.pop("tokens"), w12r.pop("tokens")
    extra = {}
    if unfused is not None:
        c = unfused.pop("tokens")
        extra = {"w12_unfused": unfused,
                 "speedup_w12_unfused_over_bf16": unfused["decode_tok_s"] / bf16["decode_tok_s"],
                 "speedup_fused_over_unfused": w12r["decode_tok_s"] / unfused["decode_tok_s"],
                 "fused_unfused_same_tokens": b == c}
    first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    figures = [pair_figures(d) for d in pairs]
    result = {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "model": "tiny-llama" if args.tiny else "llama-3.1-8b-shaped (random weights)",
        "batch": 1, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
        "compile_backend": backend, "fuse": args.fuse, "lm_head": args.lm_head, "sequential": args.sequential,
        "skip_guard_eval": args.skip_guard_eval,
        "repeats": args.repeats, "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "bf16": bf16, "w12": w12r,
        "speedup_w12_over_bf16": w12r["decode_tok_s"] / bf16["decode_tok_s"],
        "round_ratios": ratios,
        "speedup_w12_over_bf16_plain_generate": w12r["decode_tok_s_plain"] / bf16["decode_tok_s_plain"],
        "round_ratios_plain_generate": ratios_plain,
        "pairs": figures,
        "median_pair_speedup": _median([f["speedup"] for f in figures]),
        "median_pair_speedup_plain_generate": _median([f["speedup_plain_generate"] for f in figures]),
        # the same rounds read two more ways (host noise only slows a round down): the median of the paired
        # per-round ratios, and the fastest round of each model
        "median_round_ratio": _median(ratios), "median_round_ratio_plain_generate": _median(ratios_plain),
        "speedup_fastest_rounds": _max(w12r["round_tok_s"]) / _max(bf16["round_tok_s"]),
        "speedup_fastest_rounds_plain_generate": _max(w12r["round_tok_s_plain"]) / _max(bf16["round_tok_s_plain"]),
        "token_agreement": sum(x == y for x, y in zip(a, b)) / len(a),
        "first_differing_token": first_diff,
        **extra,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(summary_table(result))
    return result


def summary_table(result: dict) -> str:
    """The short table printed last: each process set's medians, then all rounds pooled."""
    rows = ["| process set | BF16 tok/s | W12 tok/s | W12/BF16 | median round ratio | plain generate W12/BF16 |",
            "|---|---|---|---|---|---|"]
    for i, p in enumerate(result["pairs"]):
        rows.append(f"| {i} | {p['bf16_tok_s']:.1f} | {p['w12_tok_s']:.1f} | {p['speedup']:.3f} | "
                    f"{p['median_round_ratio']:.3f} | {p['speedup_plain_generate']:.3f} |")
    rows.append(f"| all rounds | {result['bf16']['decode_tok_s']:.1f} | {result['w12']['decode_tok_s']:.1f} | "
                f"{result['speedup_w12_over_bf16']:.3f} | {result['median_round_ratio']:.3f} | "
                f"{result['speedup_w12_over_bf16_plain_generate']:.3f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
