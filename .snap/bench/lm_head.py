"""Certified INT8 LM head vs the BF16 head (cuBLAS) on one GPU: check first, then time.

    PYTHONUNBUFFERED=1 python bench/lm_head.py [--out PATH]   # H200: 128256×4096, 151936×5120; M = 1, 4, 32
    python bench/lm_head.py --cpu-smoke                       # tiny shape on the CPU: the same checks, no timing

Weights: random but LLM-like (Student-t rows, log-normal row norms, bf16) with planted twins: rows 2i+1 = 2i
(i < 64: exact ties) and rows 2i+1 = 2i plus one bf16 ulp in one element (64 ≤ i < 128: near ties).
Check, before any timing, per shape, M ∈ {1, 4, 32} and four kinds of hidden vectors:
    aimed    a random row's direction · 60 + N(0, 1) (the top logits stand out, as in a real model)
    twins    aimed at a planted pair (exact and one-ulp ties: the first index must win)
    random   N(0, 1) · 3, no direction (many close logits: more survivors)
    extreme  0 (all logits tie: > cap survivors → fallback), N(0, 1)·2^122 (‖x‖ overflows fp32 → fallback),
             N(0, 1)·2^-120 (denormal products)
  G1  ids == argmax of the fixed-order exact head (lm_head_int8.py step 6): every row, the guarantee
  G2  ids == argmax of cuBLAS F.linear on rows not flagged ambiguous: the accumulation model, counted
  also: the survivors' logits have the fixed-order head's bits; every exact logit (ours, cuBLAS's) ≤ rne(U)
Timing (each call captured in a CUDA graph, replayed by triton.testing.do_bench: L2 flushed, median, µs):
    bf16    F.linear(x, W).argmax(-1): cuBLAS, reads 2·V·K bytes
    fixed   the fixed-order BF16 head of the CUDA path + argmax (its reference; not tuned)
    int8    the INT8 pass kernel alone (bounds, per-block max of rne(L)): reads ⌈M/4⌉·(V·K + 8·V), writes
            2·M·V bytes; "int8 TB/s" counts exactly those bytes
    cert    torch.ops.w12.lm_head_argmax, the whole certified call (no host sync); "eager": without a graph
Napkin at 4.0 TB/s: 128256×4096 int8 525 MB → 131 µs (bf16 263 µs); 151936×5120 778 MB → 195 µs (389 µs).
The INT8 pass reads the copy once per 4 tokens (CUDA_MAX_TOKENS), so M = 32 reads it 8 times.
Exit status: 0 all checks hold; 1 G1 or a bit/bound check failed (timing still runs, marked INVALID);
2 no usable GPU / kernels; 3 only G2 (cuBLAS) disagreements on unflagged rows.
"""

import argparse
import datetime
import os
import shlex
import subprocess
import sys
import time


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def llm_like(v, k, device, seed=0):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.empty(v, k, device=device)
    for r0 in range(0, v, 16384):  # Student-t(4) by normal / sqrt(chi²/4), in chunks
        n = min(16384, v - r0)
        z = torch.randn(n, k, device=device, generator=g)
        chi = torch.randn(n, k, 4, device=device, generator=g).square().sum(-1) / 4
        w[r0:r0 + n] = z / chi.sqrt() * 0.02 * torch.exp(0.3 * torch.randn(n, 1, device=device, generator=g))
    w = w.bfloat16()
    w[1:128:2] = w[0:128:2]  # exact twins
    twin = w[128:256:2].clone()
    twin[:, 7] = torch.nextafter(twin[:, 7].float(), torch.tensor(float("inf"), device=device)).bfloat16()
    w[129:256:2] = twin  # one-ulp twins
    return w


def hidden(w, n, kind, seed):
    """n hidden vectors of one kind (see the module docstring), bf16 [n, K]."""
    import torch

    g = torch.Generator(device=w.device).manual_seed(seed)
    k = w.shape[1]
    noise = torch.randn(n, k, device=w.device, generator=g)
    if kind == "random":
        return (3 * noise).bfloat16()
    hi = 256 if kind == "twins" else w.shape[0]
    aim = torch.randint(0, hi, (n,), device=w.device, generator=g)
    d = w[aim].float()
    x = d / d.norm(dim=1, keepdim=True).clamp(min=1e-30) * 60 + noise
    if kind == "extreme":
        x[0::4] = 0
        x[1::4] = noise[1::4] * 2.0 ** 122
        x[2::4] = noise[2::4] * 2.0 ** -120
    return x.bfloat16()


# ---------------------------------------------------------------------------------------------
# the paths under test (CUDA kernels, or the CPU reference for --cpu-smoke)
# ---------------------------------------------------------------------------------------------
class Paths:
    def __init__(self, head, w, cap, cuda):
        self.head, self.w, self.cap, self.cuda = head, w, cap, cuda

    def certified(self, x, stages=3, u=None):
        import torch

        from w12.kernels import lm_head_int8 as lh

        h = self.head
        if self.cuda:
            return lh.cuda_certified(x, h.q, h.scale, h.radius, self.w, self.cap, h.u_acc, stages=stages, u=u)
        return torch.ops.w12.lm_head_argmax(x, h.q, h.scale, h.radius, h.wnorm, self.w, self.cap, h.u_acc, False)

    def op(self, x):
        import torch

        h = self.head
        return torch.ops.w12.lm_head_argmax(x, h.q, h.scale, h.radius, h.wnorm, self.w, self.cap, h.u_acc, False)

    def exact(self, x):
        """The exact head the certified argmax equals (G1): the fixed-order kernel on CUDA, F.linear on the CPU."""
        import torch.nn.functional as F

        from w12.kernels import lm_head_int8 as lh

        return lh.cuda_exact_logits(x, self.w) if self.cuda else F.linear(x, self.w)

    def upper(self, x):
        """rne(U) as fp32 [M, V] (step 4-5)."""
        import torch

        v = self.w.shape[0]
        if not self.cuda:
            return self.head.bounds(x)[1].float()
        u = torch.empty(x.shape[0], (v + 7) // 8 * 8, dtype=torch.int16, device=x.device)
        self.certified(x, u=u)
        return u[:, :v].view(torch.bfloat16).float()


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------
def check(paths, ms, n, seed0=100):
    """Per (M, kind): counts of rows, G1 / G2 failures, bit and bound violations, survivors, flags."""
    import torch
    import torch.nn.functional as F

    w = paths.w
    rows, first_bad = [], []
    for m in ms:
        for ki, kind in enumerate(("aimed", "twins", "random", "extreme")):
            st = dict(m=m, kind=kind, rows=0, g1=0, best_bits=0, surv_bits=0, over_u=0, g2=0, cublas_over_u=0,
                      differ=0, amb=0, fb=0, counts=[])
            x_all = hidden(w, n, kind, seed0 + 10 * ki + m)
            for r0 in range(0, n, m):
                x = x_all[r0:r0 + m].contiguous()
                ids, index, logits, counts, amb, fb, best = paths.certified(x)
                ex = paths.exact(x)
                ref1 = ex.argmax(1)
                cb = F.linear(x, w)
                ref2 = cb.argmax(1)
                bad1 = ids != ref1
                st["rows"] += x.shape[0]
                st["g1"] += int(bad1.sum())
                at = ex.gather(1, ids[:, None])[:, 0].float()  # the winner's logit, as a value (−0 = +0)
                st["best_bits"] += int(((best.float() != at) & ~(best.float().isnan() & at.isnan())).sum())
                slot = torch.arange(index.shape[1], device=x.device)[None]
                live = (slot < counts[:, None]) & (index >= 0) & ~fb[:, None]
                want = ex.gather(1, index.clamp(min=0))
                st["surv_bits"] += int(((logits.view(torch.int16) != want.view(torch.int16)) & live).sum())
                up = paths.upper(x)
                fin = torch.isfinite(up).all(1, keepdim=True)
                st["over_u"] += int(((ex.float() > up) & fin).sum())
                st["cublas_over_u"] += int(((cb.float() > up) & fin).sum())
                st["g2"] += int(((ids != ref2) & ~amb & ~fb).sum())
                st["differ"] += int((ref1 != ref2).sum())
                st["amb"] += int(amb.sum())
                st["fb"] += int(fb.sum())
                st["counts"].append(counts[~fb].float())
                if bad1.any() and len(first_bad) < 5:
                    i = int(bad1.nonzero()[0, 0])
                    first_bad.append(f"M={m} {kind} row {i}: got {int(ids[i])} want {int(ref1[i])} "
                                     f"count {int(counts[i])} fb {bool(fb[i])} amb {bool(amb[i])} "
                                     f"best {float(best[i])} exact max {float(ex[i].max())} "
                                     f"cands {index[i, :8].tolist()}")
            c = torch.cat(st.pop("counts"))
            st["surv_mean"] = float(c.mean()) if c.numel() else float("nan")
            st["surv_max"] = int(c.max()) if c.numel() else 0
            rows.append(st)
    return rows, first_bad


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def timed(fn):
    """(median µs, captured): fn captured in a CUDA graph, replays timed by do_bench (L2 flushed)."""
    import torch
    import triton

    fn()
    torch.cuda.synchronize()
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return triton.testing.do_bench(g.replay, return_mode="median") * 1e3, True
    except Exception as e:  # a capture failure is a finding, not a crash
        print(f"    graph capture failed ({type(e).__name__}: {str(e)[:200]}); timing eager launches", flush=True)
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, return_mode="median") * 1e3, False


def time_shape(paths, m, seed=7):
    import torch.nn.functional as F
    import triton

    w = paths.w
    v, k = w.shape
    x = hidden(w, m, "aimed", seed)
    t = {}
    t["bf16"], _ = timed(lambda: F.linear(x, w).argmax(-1))
    t["fixed"], _ = timed(lambda: paths.exact(x).argmax(-1))
    t["int8"], _ = timed(lambda: paths.certified(x, stages=1))
    t["cert"], t["graph"] = timed(lambda: paths.op(x))
    t["eager"] = triton.testing.do_bench(lambda: paths.op(x), return_mode="median") * 1e3
    counts = paths.op(x)[3]
    reads = -(-m // 4) * (v * k + 8 * v)  # the copy is read once per 4 tokens
    t["tbs"] = (reads + 2 * m * ((v + 7) // 8 * 8)) / (t["int8"] * 1e-6) / 1e12
    t["surv"] = counts.float()
    return t


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def header(torch, cuda):
    lines = [f"# Certified INT8 LM head vs BF16 head (cuBLAS) — {datetime.date.today().isoformat()}", ""]
    gpu = torch.cuda.get_device_name() if cuda else "none (CPU smoke)"
    import triton

    lines.append(f"- GPU: {gpu}; torch {torch.__version__}, triton {triton.__version__}"
                 + (f", CUDA {torch.version.cuda}" if cuda else ""))
    try:
        from w12.kernels.cuda_build import nvcc_path

        nv = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        lines.append(f"- nvcc: {nv}")
    except Exception:
        pass
    lines.append(f"- command: `{' '.join(shlex.quote(a) for a in sys.argv)}`")
    if cuda:
        lines.append(f"- torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = "
                     f"{torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}")
    return lines


def check_table(rows_by_shape):
    out = ["| V×K | M | kind | rows | G1 fail | G2 fail | cuBLAS≠fixed | ambiguous | fallback | surv mean | surv max "
           "| bits≠ | >U ours | >U cuBLAS |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for shape, rows in rows_by_shape:
        for r in rows:
            out.append(f"| {shape} | {r['m']} | {r['kind']} | {r['rows']} | {r['g1']} | {r['g2']} | {r['differ']} | "
                       f"{r['amb']} | {r['fb']} | {r['surv_mean']:.2f} | {r['surv_max']} | "
                       f"{r['best_bits'] + r['surv_bits']} | {r['over_u']} | {r['cublas_over_u']} |")
    return out


def time_table(times):
    out = ["| V×K | M | bf16 µs | fixed µs | int8 µs | int8 TB/s | cert µs | cert eager µs | speed-up | "
           "surv mean | surv max |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for shape, m, t in times:
        g = "" if t["graph"] else " (no graph)"
        out.append(f"| {shape} | {m} | {t['bf16']:.1f} | {t['fixed']:.1f} | {t['int8']:.1f} | {t['tbs']:.2f} | "
                   f"{t['cert']:.1f}{g} | {t['eager']:.1f} | {t['bf16'] / t['cert']:.2f}× | "
                   f"{t['surv'].mean():.2f} | {int(t['surv'].max())} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shape on the CPU, reference paths, no timing")
    ap.add_argument("--ms", default="1,4,32")
    ap.add_argument("--check", type=int, default=256, help="hidden vectors per (shape, M, kind) in the check")
    ap.add_argument("--cap", type=int, default=None, help="candidate slots per token (default CUDA_CAP)")
    ap.add_argument("--out", default=None, help="markdown report (default $OUT/lm-head-h200.md when $OUT is set)")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules are imported
    else:
        os.environ.setdefault("W12_CUDA", "1")  # an nvcc failure is reported, not skipped
    import torch

    from w12.kernels import lm_head_int8 as lh

    t0 = time.time()
    cuda = not args.cpu_smoke
    if cuda:
        if not torch.cuda.is_available():
            print("no CUDA device: use --cpu-smoke", file=sys.stderr)
            return 2
        try:
            lh.cuda_library()
        except Exception as e:
            print(f"the CUDA kernels did not build/load:\n{e}", file=sys.stderr)
            return 2
        shapes, device = [(128256, 4096), (151936, 5120)], "cuda"
    else:
        shapes, device = [(2000, 256)], "cpu"
        args.check = min(args.check, 32)
    cap = args.cap or lh.CUDA_CAP
    ms = [int(m) for m in args.ms.split(",")]
    out = args.out or (os.path.join(os.environ["OUT"], "lm-head-h200.md") if os.environ.get("OUT") else None)
    lines = header(torch, cuda)
    for line in lines:
        print(line, flush=True)

    checks, times, failures, g2 = [], [], [], 0
    for v, k in shapes:
        shape = f"{v}×{k}"
        w = llm_like(v, k, device)
        head = lh.CertifiedHead.from_weight(w)
        paths = Paths(head, w, cap, cuda)
        print(f"\n{shape}: head built ({time.time() - t0:.0f} s); checking {args.check} vectors per M and kind",
              flush=True)
        try:
            rows, bad = check(paths, ms, args.check)
        except Exception as e:
            print(f"CHECK CRASHED at {shape}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
        checks.append((shape, rows))
        for r in rows:
            print(f"  M={r['m']:>2} {r['kind']:<7} rows {r['rows']:>4}  G1 fail {r['g1']}  G2 fail {r['g2']}  "
                  f"cuBLAS≠fixed {r['differ']}  amb {r['amb']}  fb {r['fb']}  surv {r['surv_mean']:.2f}/{r['surv_max']}"
                  f"  bits≠ {r['best_bits'] + r['surv_bits']}  >U {r['over_u']}/{r['cublas_over_u']}", flush=True)
        failures += bad
        if any(r["g1"] or r["best_bits"] or r["surv_bits"] or r["over_u"] for r in rows):
            failures.append(f"{shape}: G1/bit/bound check failed")
        g2 += sum(r["g2"] + r["cublas_over_u"] for r in rows)
        if cuda:
            for m in ms:
                t = time_shape(paths, m)
                times.append((shape, m, t))
                print(f"  time M={m:>2}: bf16 {t['bf16']:.1f} µs  fixed {t['fixed']:.1f}  int8 {t['int8']:.1f} "
                      f"({t['tbs']:.2f} TB/s)  cert {t['cert']:.1f} (eager {t['eager']:.1f})  "
                      f"speed-up {t['bf16'] / t['cert']:.2f}×", flush=True)
        del w, head, paths
        if cuda:
            torch.cuda.empty_cache()

    status = "INVALID: " + "; ".join(failures) if failures else "all checks hold (G1 on every row)"
    lines += ["", f"- result: {status}; G2 (cuBLAS) disagreements on unflagged rows or cuBLAS logits above U: {g2}",
              f"- wall time: {time.time() - t0:.0f} s", ""]
    if times:
        lines += ["## Time (CUDA graphs, do_bench median, L2 flushed; hidden states aimed at a random row)", "",
                  *time_table(times), ""]
    lines += ["## Check (before timing)", "", *check_table(checks), "",
              "G1: ids == argmax of the fixed-order exact head (the guarantee). G2: ids == cuBLAS argmax where not "
              "ambiguous (the accumulation model). cuBLAS≠fixed: rows where the two exact heads' argmaxes differ. "
              "bits≠: winner/survivor logits that differ from the fixed-order head's bits. >U: exact logits above "
              "the certified upper bound (ours / cuBLAS's)."]
    print("\n" + "\n".join(lines[len(header(torch, cuda)):]), flush=True)
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        print(f"wrote {out}")
    return 1 if failures else (3 if g2 else 0)


if __name__ == "__main__":
    sys.exit(main())
