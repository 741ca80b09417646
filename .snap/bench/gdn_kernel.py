"""GDN tree verification on one GPU: Triton kernels vs the PyTorch references, all GDN layers of one tree pass.

    PYTHONUNBUFFERED=1 python bench/gdn_kernel.py [--out PATH]    # H200; default out: $OUT/gdn-kernel-h200.md
    python bench/gdn_kernel.py --tiny                              # CPU smoke test (Triton interpreter)

Shape: the GDN dims of Transformers' `Qwen3NextConfig()` (Qwen3-Next-80B-A3B: linear_num_key_heads,
linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim), `--layers` GDN
layers (default 48), one sequence. Inputs are random (pre-conv q|k|v ~ N(0, 1), g = −softplus(N(0,1) − 1),
beta = sigmoid(N(0, 1)), committed conv state ~ N(0, 1), recurrent state ~ N(0, 0.05²) fp32); each layer
has its own random conv weights (a Qwen3NextGatedDeltaNet with a small hidden size: only its conv and dims
are used). Tree: the best-first tree of `--nodes` nodes (root included) over the recorded SmolLM2 drafter
lattices (bench/results/specdec-work/trunc-fp32.json.gz) with the median number of root paths; a random
tree (each parent among the previous 6 nodes) if the recording cannot be read.

1. Check (before any timing), every layer: core outputs of the Triton kernels (path / node schedule of the
   recurrent kernel, WY kernel in ieee fp32 and tf32) vs `verify_gdn_paths` (PyTorch path recompute) and
   `verify_gdn_snapshots` (PyTorch per-node snapshots); max abs error and max abs error / max |ref|.
   Once in --dtype (default bf16: bf16 conv and q/k/v, fp32 recurrent state, as a bf16 model runs),
   once in fp32 on two layers (tight).
2. Time one tree pass over all layers (ms, triton.testing.do_bench: launches queued, L2 flushed, median):
   kernels alone (q/k/v post-conv given), eager and replayed from a CUDA graph (no Python launch cost);
   the whole method `verify_gdn_paths_triton` (conv windows + kernel); PyTorch path recompute; PyTorch
   per-node snapshots (which keep every layer's snapshots, as the real verification holds them).
3. State bytes held during the pass: computed, and measured (torch.cuda.max_memory_allocated − allocated
   before; the inputs exist before and are not counted).
The PyTorch references are Transformers' pure-PyTorch functions (any fla / causal_conv1d dispatch is
unwrapped). Exit status 1 if a check fails or a measurement errors (the table says which).
"""

import argparse
import importlib.util
import inspect
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

REC = Path(__file__).parent / "results" / "specdec-work" / "trunc-fp32.json.gz"
MiB = 2 ** 20
# max abs error / max |ref| allowed, by the dtype of the comparison (ieee kernels; tf32 is looser)
TOL = {"float32": 1e-4, "bfloat16": 1.6e-2}
TOL_TF32 = 3e-2


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shape on the CPU (Triton interpreter)")
    ap.add_argument("--layers", type=int, default=None, help="GDN layers (default 48; --tiny: 2)")
    ap.add_argument("--nodes", type=int, default=None, help="tree nodes, root included (default 32; --tiny: 16)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="markdown output (default $OUT/gdn-kernel-h200.md if $OUT)")
    a = ap.parse_args(argv)
    a.layers = a.layers or (2 if a.tiny else 48)
    a.nodes = a.nodes or (16 if a.tiny else 32)
    if a.out is None and os.environ.get("OUT") and not a.tiny:
        a.out = str(Path(os.environ["OUT"]) / "gdn-kernel-h200.md")
    return a


ARGS = parse(sys.argv[1:])
if ARGS.tiny:
    os.environ.setdefault("TRITON_INTERPRET", "1")      # before any kernel module is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen3NextConfig  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as hf  # noqa: E402

from w12.kernels import gdn_path_triton as gk  # noqa: E402
from w12.specdec import gdn_tree as gt  # noqa: E402

# the pure-PyTorch reference even where fla / causal_conv1d would be dispatched to
_RULE = inspect.unwrap(hf.torch_recurrent_gated_delta_rule)


def rule_equal_heads(query, key, value, **kw):
    """Transformers' rule, held to equal q/k/v head counts. Up to Transformers 5.18 (the H200 image has 5.17)
    the rule does not group heads -- Qwen3NextGatedDeltaNet.forward repeat_interleaves q/k to the value heads
    before calling it -- so the references must expand them (gdn_tree.expand_key_heads). Holding every
    version to that makes --tiny (grouped heads) catch a reference that does not, on any Transformers."""
    if not query.shape[2] == key.shape[2] == value.shape[2]:
        raise RuntimeError(f"reference rule called with {key.shape[2]} key heads and {value.shape[2]} value "
                           f"heads: expand q/k to the value heads first (repeat_interleave)")
    return _RULE(query, key, value, **kw)


gt.torch_recurrent_gated_delta_rule = rule_equal_heads
gt.causal_conv1d_update = inspect.unwrap(hf.causal_conv1d_update)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --- the problem -----------------------------------------------------------------------------------

def gdn_dims(tiny: bool) -> dict:
    if tiny:
        # grouped heads as in Qwen3-Next (HV = 2·HK), HK > 1 so h // G and a tile (h % HK) differ
        return dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4)
    c = Qwen3NextConfig()
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim")
    return {k: getattr(c, k) for k in keys}


def make_tree(n: int, seed: int):
    """(parents, description): median-P best-first tree over recorded lattices, or a random deep tree."""
    try:
        from w12.specdec.replay import load_records
        from w12.specdec.trees import make_builder

        records, _ = load_records(REC)
        lats = [lat for r in records for lat in r.lattices if lat.positions]
        build = make_builder("best-first", n - 1)
        trees = sorted((build(lat, 0) for lat in lats), key=lambda t: len(gt.root_paths(t)))
        t = trees[len(trees) // 2]
        if len(t) == n:
            return t.parents.tolist(), (f"best-first, budget {n - 1} (+ root), over the {len(lats)} recorded "
                                        f"SmolLM2 drafter lattices, the one with the median root-path count")
        log(f"median tree has {len(t)} nodes, not {n}: using a random tree")
    except Exception as e:  # noqa: BLE001 -- the recording is optional
        log(f"recorded lattices unusable ({type(e).__name__}: {e}): using a random tree")
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(max(0, i - 6), i, (1,), generator=g)) for i in range(1, n)]
    return parents, "random: each node's parent drawn among the previous 6 nodes"


def make_layers(dims, L, n, dtype, device, seed):
    """[(gdn module, GDNInputs, conv0 [1, C, K], rec0 [1, HV, dk, dv] fp32)] per layer."""
    cfg = Qwen3NextConfig(hidden_size=64, **dims)
    out = []
    for i in range(L):
        torch.manual_seed(seed + i)
        gdn = hf.Qwen3NextGatedDeltaNet(cfg, i).eval().to(device, dtype)
        g = torch.Generator(device=device).manual_seed(seed + 1000 + i)
        r = lambda *s: torch.randn(*s, device=device, generator=g)  # noqa: E731
        HV = gdn.num_v_heads
        inp = gt.GDNInputs(r(n, gdn.conv_dim).to(dtype), -F.softplus(r(n, HV) - 1), r(n, HV).sigmoid().to(dtype))
        conv0 = r(1, gdn.conv_dim, gdn.conv_kernel_size).to(dtype)
        rec0 = r(1, HV, gdn.head_k_dim, gdn.head_v_dim) * 0.05
        out.append((gdn, inp, conv0, rec0))
    return out


# --- 1. check ----------------------------------------------------------------------------------------

KERNELS = {"triton path": dict(kernel="path"), "triton node": dict(kernel="node"),
           "triton WY ieee": dict(kernel="wy", precision="ieee"), "triton WY tf32": dict(kernel="wy", precision="tf32")}


def kernel_core(gdn, inp, plan, conv0, rec0, kernel, **launch):
    """verify_gdn_paths_triton with launch options (precision, bv, num_warps)."""
    q, k, v, _ = gt.tree_conv(gdn, inp, plan, conv0)
    o = gk.tree_outputs(q, k, v, inp.g, inp.beta, rec0, plan, method=kernel, **launch)
    return o.to(q.dtype).float()


def check(layers, parents, dtype_name):
    """Rows (method, max abs err vs torch path recompute, vs torch snapshots, max |ref|, worst rel, ok)
    over all layers."""
    plan = gk.plan_tree(parents, layers[0][3].device)
    paths = gk.root_paths(parents)
    err = {}
    for gdn, inp, conv0, rec0 in layers:
        with torch.no_grad():
            rp, _ = gt.verify_gdn_paths(gdn, inp, paths, conv0, rec0)
            rs, _ = gt.verify_gdn_snapshots(gdn, inp, parents, conv0, rec0)
            outs = {"torch path recompute": rp}
            for name, kw in KERNELS.items():
                outs[name] = kernel_core(gdn, inp, plan, conv0, rec0, **kw)
        for name, o in outs.items():
            for vs, ref in (("torch path recompute", rp), ("torch snapshots", rs)):
                if name == vs:
                    continue
                e, m = err.get((name, vs), (0.0, 0.0))
                err[(name, vs)] = (max(e, (o - ref).abs().max().item()), max(m, ref.abs().max().item()))
    rows = []
    for name in outs:
        e_p = err.get((name, "torch path recompute"), (0.0, 0.0))[0]
        e_s, m = err[(name, "torch snapshots")]
        tol = TOL_TF32 if "tf32" in name else TOL[dtype_name]
        rows.append((name, e_p, e_s, m, max(e_p, e_s) / m, max(e_p, e_s) / m <= tol))
    return rows


def module_anchor(gdn, T, seed):
    """The PyTorch reference vs Transformers itself: (max abs error, max |ref|) of the layer output from
    `verify_gdn_paths` on a chain of T tokens from the zero state (+ gated norm, out_proj) vs
    `Qwen3NextGatedDeltaNet.forward` without a cache (zero conv history and state, Transformers' own head
    grouping and chunked rule)."""
    p = gdn.dt_bias
    g = torch.Generator(device=p.device).manual_seed(seed)
    h = torch.randn(1, T, gdn.hidden_size, device=p.device, generator=g).to(p.dtype)
    ref = gdn(h)
    inp, z = gt.gdn_project(gdn, h)
    conv0 = torch.zeros(1, gdn.conv_dim, gdn.conv_kernel_size, device=p.device, dtype=p.dtype)
    rec0 = torch.zeros(1, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim, device=p.device)
    core, _ = gt.verify_gdn_paths(gdn, inp, [list(range(T))], conv0, rec0)
    out = gt.gdn_output(gdn, core, z)
    return (out.float() - ref.float()).abs().max().item(), ref.float().abs().max().item()


# --- 2./3. timing and memory ---------------------------------------------------------------------------

def graphed(fn):
    """fn captured in a CUDA graph (after one warm-up call on a side stream): its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        fn()
    return gr.replay


def time_ms(fn, cuda: bool) -> float:
    """Median ms: do_bench on the GPU; on the CPU (interpreter smoke test) a wall-clock median of 3."""
    if cuda:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def peak_bytes(fn, cuda: bool):
    """Peak bytes allocated while fn runs (and holds its result), above what was allocated before."""
    if not cuda:
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def methods(layers, parents, pre, cuda):
    """name -> (fn over all layers, uses CUDA graph?). Kernel-only entries take the precomputed q/k/v."""
    dev = layers[0][3].device
    plan = gk.plan_tree(parents, dev)
    paths = gk.root_paths(parents)

    def kernel_only(method, **kw):
        return lambda: [gk.tree_outputs(q, k, v, inp.g, inp.beta, rec0, plan, method=method, **kw)
                        for (q, k, v), (_, inp, _, rec0) in zip(pre, layers)][-1]

    def whole(kernel):
        return lambda: [gt.verify_gdn_paths_triton(gdn, inp, plan, conv0, rec0, kernel)[0]
                        for gdn, inp, conv0, rec0 in layers][-1]

    def torch_paths():
        return [gt.verify_gdn_paths(gdn, inp, paths, c0, r0)[0] for gdn, inp, c0, r0 in layers][-1]

    def torch_snaps():   # every layer's snapshots are held until the commit
        return [gt.verify_gdn_snapshots(gdn, inp, parents, c0, r0)[1] for gdn, inp, c0, r0 in layers]

    m = {}
    for bv in ((16, 32, 64) if cuda else (None,)):
        m[f"triton path kernel, BV={bv or 'auto'}"] = (kernel_only("path", bv=bv), cuda)
    m["triton node kernel"] = (kernel_only("node"), cuda)
    for prec in ("ieee", "tf32"):
        for bv, nw in (((16, 4), (32, 4), (32, 8)) if cuda else ((None, None),)):
            m[f"triton WY kernel {prec}, BV={bv or 'auto'}, {nw or 4} warps"] = (
                kernel_only("wy", precision=prec, bv=bv, num_warps=nw), cuda)
    m["triton path kernel, eager launches"] = (kernel_only("path"), False)
    m["triton WY ieee kernel, eager launches"] = (kernel_only("wy"), False)
    m["verify_gdn_paths_triton (conv windows + path kernel)"] = (whole("path"), cuda)
    m["verify_gdn_paths_triton (conv windows + path kernel), eager"] = (whole("path"), False)
    m["torch path recompute (verify_gdn_paths), eager"] = (torch_paths, False)
    m["torch per-node snapshots (verify_gdn_snapshots), eager"] = (torch_snaps, False)
    return m


def computed_state(name, dims, parents, L, dtype):
    """Bytes of GDN state the method holds (one sequence), from the shapes; the rule in words."""
    C = 2 * dims["linear_num_key_heads"] * dims["linear_key_head_dim"] + \
        dims["linear_num_value_heads"] * dims["linear_value_head_dim"]
    conv = C * dims["linear_conv_kernel_dim"] * torch.finfo(dtype).bits // 8
    rec = dims["linear_num_value_heads"] * dims["linear_key_head_dim"] * dims["linear_value_head_dim"] * 4
    N, P = len(parents), len(gk.root_paths(parents))
    if "snapshot" in name:
        return L * N * (conv + rec), "L·N·(conv + rec), all held until the commit"
    if "torch path" in name:
        return P * (conv + rec), "P·(conv + rec), one layer at a time"
    if name.startswith("verify_gdn_paths_triton"):
        return N * conv, "N conv windows of one layer; no recurrent state in memory"
    return 0, "none in memory (state in registers)"


def summary(rows, dims, parents, dtype) -> str:
    """One line: the fastest Triton kernel vs the two PyTorch references, and the state each holds."""
    ms = {n: t for n, t, _ in rows if t is not None}
    tri = min((n for n in ms if n.startswith("triton")), key=ms.get, default=None)
    ref = {k: next((n for n in ms if n.startswith(k)), None) for k in ("torch path", "torch per-node")}
    if tri is None or None in ref.values():
        return "Summary: incomplete (see the errors)."
    st = {k: computed_state(n, dims, parents, ARGS.layers, dtype)[0] / MiB
          for k, n in (("s", ref["torch per-node"]), ("p", ref["torch path"]),
                       ("t", "verify_gdn_paths_triton"))}
    return (f"Summary: fastest Triton kernel ({tri}) {ms[tri]:.3f} ms vs PyTorch path recompute "
            f"{ms[ref['torch path']]:.1f} ms and per-node snapshots {ms[ref['torch per-node']]:.1f} ms per tree pass "
            f"({ARGS.layers} layers); GDN state held: snapshots {st['s']:.1f} MiB, PyTorch path recompute "
            f"{st['p']:.1f} MiB, Triton {st['t']:.2f} MiB (conv windows only).")


# --- report -------------------------------------------------------------------------------------------

def main() -> int:
    cuda = not ARGS.tiny
    if cuda and not torch.cuda.is_available():
        log("no CUDA device: run with --tiny for the CPU smoke test")
        return 2
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = getattr(torch, ARGS.dtype)
    torch.set_grad_enabled(False)
    dims = gdn_dims(ARGS.tiny)
    parents, tree_desc = make_tree(ARGS.nodes, ARGS.seed)
    plan = gk.plan_tree(parents)
    N, P, depth, work = len(parents), len(plan.paths), plan.max_len - 1, sum(map(len, plan.paths))
    gpu = torch.cuda.get_device_name() if cuda else f"CPU {platform.machine()} (Triton interpreter)"
    cmd = " ".join(["python"] + sys.argv)
    fla = any(importlib.util.find_spec(p) for p in ("fla", "causal_conv1d"))
    md = [f"# GDN tree verification kernels: {ARGS.layers} GDN layers × {N} nodes, {gpu}", "",
          f"- command: `{cmd}`", f"- GPU: {gpu}; torch {torch.__version__}, triton {triton.__version__}, "
          f"transformers {transformers.__version__}",
          ("- GDN dims (tiny smoke-test shape): " if ARGS.tiny else
           "- GDN dims (Transformers `Qwen3NextConfig()` = Qwen3-Next-80B-A3B): ") +
          ", ".join(f"{k} {v}" for k, v in dims.items()) + f"; {ARGS.layers} GDN layers "
          "(the 80B model itself has 36 GDN + 12 attention layers), batch 1",
          f"- tree: {N} nodes (root + {N - 1} drafted), {P} root paths, depth {depth}, Σ path lengths {work}; "
          f"{tree_desc}; parents {parents}",
          f"- dtype: {ARGS.dtype} conv state / q·k·v, fp32 recurrent state; random inputs; PyTorch references = "
          f"Transformers' pure-PyTorch GDN functions{' (fla/causal_conv1d installed, unwrapped)' if fla else ''}",
          ""]
    failed = []

    # 1. check
    layers = make_layers(dims, ARGS.layers, N, dtype, dev, ARGS.seed)
    checks = [(ARGS.dtype, ARGS.layers, layers)]
    if ARGS.dtype != "float32":
        checks.append(("float32", min(2, ARGS.layers), make_layers(dims, min(2, ARGS.layers), N, torch.float32,
                                                                   dev, ARGS.seed)))
    md += ["## Check (before timing): core outputs vs the PyTorch references, max over layers and nodes", "",
           "| dtype, layers | method | max abs err vs torch path recompute | vs torch snapshots | max abs ref | "
           "worst rel | ok |", "|---|---|---|---|---|---|---|"]
    for dname, nl, lay in checks:
        log(f"check: {dname}, {nl} layers ...")
        try:
            for name, e_p, e_s, m, r, ok in check(lay, parents, dname):
                md.append(f"| {dname}, {nl} | {name} | {e_p:.3g} | {e_s:.3g} | {m:.3g} | {r:.3g} | "
                          f"{'yes' if ok else 'NO'} |")
                if not ok:
                    failed.append(f"check {dname}: {name}: rel error {r:.3g}")
        except Exception as e:  # noqa: BLE001 -- report, keep going
            traceback.print_exc()
            failed.append(f"check {dname}: {type(e).__name__}: {e}")
            md.append(f"| {dname}, {nl} | ERROR | {type(e).__name__}: {e} | | | | NO |")
    anchor = []
    for dname, nl, lay in checks:
        if dname != "float32":
            continue
        try:
            with torch.no_grad():
                e, m = max((module_anchor(gdn, N, ARGS.seed + 2000 + j) for j, (gdn, *_) in enumerate(lay)),
                           key=lambda em: em[0] / em[1])
            ok = e / m <= TOL["float32"]
            anchor.append(f"Reference vs Transformers ({dname}, {nl} layers): `verify_gdn_paths` on a chain of {N} "
                          f"tokens from the zero state, through the gated norm and out_proj, vs "
                          f"`Qwen3NextGatedDeltaNet.forward` (no cache): max abs err {e:.3g}, max abs ref {m:.3g}, "
                          f"rel {e / m:.3g} -- {'ok' if ok else 'NO'}.")
            if not ok:
                failed.append(f"reference vs Qwen3NextGatedDeltaNet.forward: rel error {e / m:.3g}")
        except Exception as e:  # noqa: BLE001 -- report, keep going
            traceback.print_exc()
            failed.append(f"reference vs Qwen3NextGatedDeltaNet.forward: {type(e).__name__}: {e}")
            anchor.append(f"Reference vs Transformers: ERROR {type(e).__name__}: {e}")
    md += ["", *anchor] if anchor else []
    checks = lay = None
    log("\n".join(md))

    # 2./3. timing and memory
    pre, dplan = [], gk.plan_tree(parents, dev)
    for gdn, inp, conv0, rec0 in layers:
        q, k, v, _ = gt.tree_conv(gdn, inp, dplan, conv0)
        pre.append((q.contiguous(), k.contiguous(), v.contiguous()))
    md += ["", f"## One tree pass, all {ARGS.layers} GDN layers" + (" (CPU interpreter: wall ms, informative "
           "only)" if not cuda else ""), "",
           "| method | ms | speed-up vs torch path recompute | state held, computed (MiB) | rule | "
           "peak allocated, measured (MiB) |",
           "|---|---|---|---|---|---|"]
    rows, base = [], None
    for name, (fn, graph) in methods(layers, parents, pre, cuda).items():
        log(f"time: {name} ...")
        try:
            fn()                                             # compile / warm up
            ms = time_ms(graphed(fn) if graph else fn, cuda)
            peak = peak_bytes(fn, cuda)
        except Exception as e:  # noqa: BLE001 -- report, keep going
            traceback.print_exc()
            failed.append(f"{name}: {type(e).__name__}: {e}")
            rows.append((name + (" (CUDA graph)" if graph else ""), None, None))
            continue
        rows.append((name + (" (CUDA graph)" if graph else ""), ms, peak))
        if name.startswith("torch path"):
            base = ms
    for name, ms, peak in rows:
        comp, rule = computed_state(name, dims, parents, ARGS.layers, dtype)
        if ms is None:
            md.append(f"| {name} | ERROR | | | | |")
            continue
        speed = (f"{base / ms:.3g}×" if base / ms < 1000 else f"{base / ms:.0f}×") if base else \
            "n/a (torch path recompute failed)"
        measured = "n/a" if peak is None else f"{peak / MiB:.2f}"
        md.append(f"| {name} | {ms:.3f} | {speed} | {comp / MiB:.2f} | {rule} | {measured} |")
    md += ["", "Timing: " + ("triton.testing.do_bench (launches queued, L2 flushed before each run, median); "
           "'CUDA graph' rows replay the whole pass's launches from a graph (no Python launch cost), 'eager' rows "
           "launch from Python as the engine does." if cuda else "CPU wall clock through the Triton interpreter; "
           "a smoke test of the code paths, not a timing."),
           "Measured peak: torch.cuda.max_memory_allocated during one pass minus the memory allocated before "
           "(inputs, modules and committed states excluded; outputs and allocator temporaries included). "
           "The recompute methods also keep the per-node pre-conv inputs (token-sized stash) for the commit, "
           "which exist before the pass here and are not counted."]
    md += ["", summary(rows, dims, parents, dtype)]
    if failed:
        md += ["", "## FAILED", ""] + [f"- {f}" for f in failed]
    text = "\n".join(md) + "\n"
    print(text)
    if ARGS.out:
        Path(ARGS.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ARGS.out).write_text(text)
        log(f"wrote {ARGS.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
