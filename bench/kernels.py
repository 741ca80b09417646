"""W12 GEMM vs 8-bit-view GEMM vs cuBLAS BF16 on one GPU: check first, then time.

    PYTHONUNBUFFERED=1 python bench/kernels.py [--sweep] [--cuda-sweep] [--out DIR]

1. Encodes random weights (randn·0.02 in bf16 plus a few zeros → escapes) on the GPU with a torch port of
   the reference encoder (checked byte-for-byte against formats.reference on a small matrix first), and
   checks the lossless round trip of every shape.
2. Checks every shape and every M against the reference (decoded weights → fp32 matmul): max relative
   error ‖y − ref‖∞ / ‖ref‖∞, and bitwise-identical outputs over 10 repeated runs; PTX and portable
   decode paths both bit-exact on an identity product; a CUDA-graph capture and torch.compile of the op.
3. --sweep: tries candidate Triton configs per (shape, M bucket) and keeps the fastest (printed as a
   TABLE); --cuda-sweep does the same for the CUDA skinny kernel (kernels/w12_gemv.cu, M ≤ 64), each
   candidate checked against the reference before it is timed.
4. Times W12 (what torch.ops.w12.gemm dispatches to: the CUDA kernels of kernels/w12_gemv.cu for M ≤ 128 —
   skinny, stream or ws by gemm_cuda.kernel_for —, Triton where the CUDA build is unavailable), the Triton kernel
   alone, view and cuBLAS (`torch.matmul(x, w.t())`) with triton.testing.do_bench (launches queued,
   L2 flushed, median). Bytes read: W12 = 12 KB per record + x; view = 8 KB per record + x;
   cuBLAS = 2·N·K + x. At 4.0 TB/s a W12 weight costs 0.375 ps, a bf16 weight 0.5 ps: the byte-floor
   ratio to a cuBLAS that reads at full speed is 1.33× (view 2×).
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

import torch
import triton

from w12.formats import reference as fmt
from w12.kernels import gemm as g
from w12.kernels import gemm_cuda as gc
from w12.kernels import ops  # noqa: F401  (registers torch.ops.w12.*)
from revision import commit  # noqa: E402  (bench/revision.py)

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096),
          (10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600), (151936, 5120)]
MS = [1, 2, 4, 8, 16, 32, 48, 64, 128]
HF_SHAPES = [(1024, 4096), (14336, 4096)]  # Llama-3.1-8B k/v and gate/up as Transformers runs them
TN, TK, WIN = 128, 64, 16


# ---------------------------------------------------------------------------------------------- encode
def encode_gpu(bits: torch.Tensor, chunk_rows: int = 8192):
    """torch-on-device port of formats.reference.encode (same outputs), in row chunks of whole tiles."""
    n, k = bits.shape
    dev = bits.device
    nb, kb = triton.cdiv(n, TN), triton.cdiv(k, TK)
    k_pad = kb * TK
    recs, exps, cnts, escs = [], [], [], []
    cand = torch.arange(16, 255, device=dev)
    for r0 in range(0, n, chunk_rows):
        h = bits[r0:r0 + chunk_rows].to(torch.int32) & 0xFFFF
        rn = h.shape[0]
        cnb = triton.cdiv(rn, TN)
        s, e, m = h >> 15, (h >> 7) & 0xFF, h & 0x7F
        normal = (e >= 1) & (e <= 254)
        hist = torch.zeros(rn, 256, dtype=torch.int32, device=dev)
        hist.scatter_add_(1, e.long(), normal.int())
        cum = torch.cat([torch.zeros(rn, 1, dtype=torch.int32, device=dev), hist.cumsum(1, dtype=torch.int32)], 1)
        count = cum[:, cand + 1] - cum[:, cand + 1 - WIN]
        top = cand[count.argmax(dim=1)].to(torch.int32)
        u = e - (top[:, None] - (WIN - 1))
        inw = normal & (u >= 0) & (u <= WIN - 1)
        b = torch.where(inw, (s << 7) | (u << 3) | (m >> 4), 0).to(torch.uint8)
        lo = torch.where(inw, m & 0xF, 0).to(torch.uint8)
        bp = torch.zeros(cnb * TN, k_pad, dtype=torch.uint8, device=dev)
        lp = torch.zeros(cnb * TN, k_pad, dtype=torch.uint8, device=dev)
        bp[:rn, :k], lp[:rn, :k] = b, lo
        view = bp.view(cnb, TN, kb, TK).permute(0, 2, 1, 3).reshape(cnb, kb, 8192)
        lt = lp.view(cnb, TN, kb, 2, TK // 2)
        nib = (lt[:, :, :, 0] | (lt[:, :, :, 1] << 4)).permute(0, 2, 1, 3).reshape(cnb, kb, 4096)
        recs.append(torch.cat([view, nib], dim=2))
        ex = torch.full((cnb * TN,), 16, dtype=torch.uint8, device=dev)
        ex[:rn] = top.to(torch.uint8)
        exps.append(ex)
        rows, cols = torch.nonzero(~inw, as_tuple=True)
        rec = (rows // TN) * kb + cols // TK
        pos = (rows % TN) * TK + cols % TK
        order = torch.argsort(rec * 8192 + pos)
        cnts.append(torch.bincount(rec, minlength=cnb * kb).to(torch.int32).view(cnb, kb))
        es = torch.stack([pos[order], h[rows, cols][order]], dim=1).to(torch.int32)
        escs.append(torch.where(es > 32767, es - 65536, es).to(torch.int16))
    return torch.cat(recs), torch.cat(exps), torch.cat(cnts), torch.cat(escs)


def decode_gpu(records, exps, counts, escapes, n, k, view=False):
    """torch-on-device port of formats.reference.decode -> bf16 [N, K]."""
    nb, kb = counts.shape
    b, lo = fmt.unpack_codes(records, nb * TN, kb * TK)
    if view:
        lo = torch.full_like(lo, 8)
    top = exps.to(torch.int32)[:, None]
    h = ((b >> 7) << 15) | ((top - (WIN - 1) + ((b >> 3) & 0xF)) << 7) | ((b & 7) << 4) | lo
    if not view:
        rec = torch.repeat_interleave(torch.arange(nb * kb, device=records.device), counts.reshape(-1).long())
        pos = escapes[:, 0].long()
        h[(rec // kb) * TN + pos // TK, (rec % kb) * TK + pos % TK] = escapes[:, 1].to(torch.int32) & 0xFFFF
    h = h[:n, :k]
    return torch.where(h > 32767, h - 65536, h).to(torch.int16).view(torch.bfloat16)


def make_weight(n, k, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    idx = torch.randint(0, n * k, (max(8, n * k // 20000),), device="cuda", generator=gen)
    w.view(-1)[idx] = 0.0  # ~5e-5 zeros -> escapes
    return w


# ---------------------------------------------------------------------------------------------- timing
_SPIN = {}


def spin(ms=40):
    """Keep the GPU busy for ~ms so its clocks are up (they drop while the host compiles)."""
    if "a" not in _SPIN:
        _SPIN["a"] = torch.randn(8192, 8192, device="cuda").to(torch.bfloat16)
    a = _SPIN["a"]
    for _ in range(int(ms / 1.4)):
        a @ a


def bench(fn, rep=40, clean=False):
    """Median µs of fn captured in a CUDA graph, replayed by do_bench (L2 flushed before each replay).
    A graph, because the Python launcher costs more host time than do_bench's L2 flush hides: without
    it the GPU idles between the start event and the kernel and small kernels read 2-4× slow, at random.
    clean=True: the same, but the L2 is flushed by READING 512 MB (bench_clean) instead of do_bench's
    zeroing of 256 MB, which leaves ~50 MB of dirty lines whose write-back is charged to the next kernel."""
    fn()  # compile (and allocate the split-K tickets) outside the capture
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        fn()
    if clean:
        return bench_clean(gr.replay)
    return triton.testing.do_bench(gr.replay, warmup=25, rep=rep, return_mode="median") * 1e3


_FLUSH = {}


def bench_clean(replay, n=60):
    """do_bench's loop (events around each replay, all queued, no sync per repetition, median) with a
    read-only L2 flush: a max-reduction over 512 MB leaves the L2 full of clean lines of another buffer."""
    if "buf" not in _FLUSH:
        _FLUSH["buf"] = torch.ones(128 << 20, dtype=torch.int32, device="cuda")
    buf = _FLUSH["buf"]
    for _ in range(5):
        buf.max()
        replay()
    st = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    en = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        buf.max()
        st[i].record()
        replay()
        en[i].record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in zip(st, en))[n // 2] * 1e3


def sweep_cases(ms, seed0: int = 100, shapes=None):
    """The config sweeps' common loop (bench/ws_configs.py, bench/skinny_configs.py): for every
    shape (default SHAPES) and M in ms, (n, k, m, Mat, x, fp32 reference, cuBLAS BF16 µs); GPU memory released
    after each shape."""
    for si, (n, k) in enumerate(shapes or SHAPES):
        mt = Mat(n, k, seed0 + si)
        wf = mt.w.float()
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            yield n, k, m, mt, x, x.float() @ wf.t(), bench(lambda: torch.matmul(x, mt.w.t()))
        torch.cuda.empty_cache()


def identity_product(cands, variant_of) -> set:
    """Each config of cands on N = 300 × K = 1024 with escapes, X = the identity (Y = W as the kernel decodes it),
    with a full and a partial M tile: in-window weights and the 8-bit view bit-exact, escapes restored.  Returns
    variant_of(config) for those that failed (printed)."""
    n, k = 300, 1024
    w = make_weight(n, k, 3)
    w.view(-1)[::997] = torch.tensor(100.0, dtype=torch.bfloat16)  # out-of-window weights: escapes
    mt, esc = mat_of(w)
    wq = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, n, k, view=True)
    bad = set()
    for cfg in cands:
        for m in (8 * cfg.nt, 8 * cfg.nt - 3):  # a full M tile and a partial one
            try:
                yt, yq = mt.seen(m, cuda=cfg), mt.seen(m, view=True, cuda=cfg)
            except RuntimeError as e:  # a launch error
                print(f"FAIL identity product {cfg} M={m}: {e}", flush=True)
                bad.add(variant_of(cfg))
                continue
            fails = [what for what, ok in (
                ("decode", torch.equal(yt.view(torch.int16)[~esc], w.view(torch.int16)[~esc])),
                ("escapes", torch.allclose(yt[esc].float(), w[esc].float(), rtol=2**-8, atol=1e-6)),
                ("view", torch.equal(yq.view(torch.int16)[~esc], wq.view(torch.int16)[~esc]))) if not ok]
            if fails:
                print(f"FAIL identity product {cfg} M={m}: {', '.join(fails)}", flush=True)
                bad.add(variant_of(cfg))
    return bad


def run_isolated(script: str, variants, arg_of, limit_s: int = 180) -> set:
    """`python script --identity arg_of(v)` for every variant, all at once, each in its own process: an illegal access
    (which ends a CUDA process) or a hang (killed after limit_s) then only disqualifies its own variant.  Prints a
    line per failure and a summary; returns the variants that failed, crashed or hung."""
    procs = {v: subprocess.Popen([sys.executable, script, "--identity", arg_of(v)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for v in variants}
    bad = set()
    for v, p in procs.items():
        try:
            out = p.communicate(timeout=limit_s)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + f"\n(no result within {limit_s} s: a hang)"
        if p.returncode != 0:
            tail = " | ".join(out.strip().splitlines()[-3:])
            print(f"FAIL identity product, variant {v}: exit {p.returncode}: {tail}", flush=True)
            bad.add(v)
    print(f"identity product: {len(procs) - len(bad)} of {len(procs)} variants bit-exact (W12 and view, escapes, "
          f"full and partial M tiles, split 1 and 3); failed: {sorted(bad) or 'none'}", flush=True)
    return bad


def write_files(out: str, kind: str, text: str, best_of: dict, raw) -> None:
    """OUT/{kind}_configs.md (text), OUT/{kind}_table.py (a {KIND}_TABLE = {...} that W12_{KIND}_TABLE loads) and
    OUT/{kind}_configs.json (raw)."""
    with open(os.path.join(out, f"{kind}_configs.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(out, f"{kind}_table.py"), "w") as fh:
        fh.write(f"{kind.upper()}_TABLE = {{\n" + "".join(f"    {key}: {c!r},\n" for key, c in best_of.items()) + "}\n")
    with open(os.path.join(out, f"{kind}_configs.json"), "w") as fh:
        json.dump(raw, fh, indent=1)


def rel(y, ref):
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def mat_of(w):
    """A Mat of the given bf16 weights [n, k] (encoded on the GPU), and the mask of its escapes."""
    from w12.formats import reference as fmt
    mt = Mat.__new__(Mat)
    mt.n, mt.k, mt.w = *w.shape, w
    mt.records, mt.exps, mt.counts, mt.escapes = encode_gpu(w.view(torch.int16))
    mt.offs, mt.cols = g.prepare_escapes(mt.counts, mt.escapes)
    mt.nnz = mt.escapes.shape[0]
    rows, cols = fmt.escape_coordinates(mt.counts.cpu(), mt.escapes.cpu())
    esc = torch.zeros(w.shape, dtype=torch.bool, device=w.device)
    esc[rows.to(w.device), cols.to(w.device)] = True
    return mt, esc


class Mat:
    def __init__(self, n, k, seed):
        self.n, self.k = n, k
        self.w = make_weight(n, k, seed)
        self.records, self.exps, self.counts, self.escapes = encode_gpu(self.w.view(torch.int16))
        self.offs, self.cols = g.prepare_escapes(self.counts, self.escapes)
        self.nnz = self.escapes.shape[0]

    def seen(self, m, view=False, cuda=None):
        """W [n, k] as the kernel sees it: the identity product X = rows i..i+m−1 of I_K, Y[m, n] = W[n, i + m]."""
        eye = torch.eye(self.k, device="cuda", dtype=torch.bfloat16)
        return torch.cat([self.run(eye[i:i + m], view=view, cuda=cuda) for i in range(0, self.k, m)]).t()

    def run(self, x, view=False, cfg=None, use_ptx=None, cuda=None):
        if cuda is not None:
            return gc.launch(x, self.records, self.exps, self.n, self.escapes, self.offs, self.cols,
                             view=view, config=cuda)
        if view:
            return g.launch(x, self.records, self.exps, self.n, view=True, config=cfg, use_ptx=use_ptx)
        return g.launch(x, self.records, self.exps, self.n, self.escapes, self.offs, self.cols,
                        config=cfg, use_ptx=use_ptx)

    def op(self, x, view=False):
        """What the custom op runs for x (a CUDA kernel where gemm_cuda.kernel_for names one, else Triton; the op's
        decode + cuBLAS paths — above ops.LARGE_M rows, and gemm_cuda.prefers_decode's small matrices — never take
        the bench's shapes at M ≤ 128)."""
        if gc.usable(x, self.records, self.exps, self.n):
            return gc.launch(x, self.records, self.exps, self.n, self.escapes, self.offs, self.cols, view=view)
        return self.run(x, view=view)

    def no_escapes(self):
        """(escapes, offsets, columns) of empty escape lists for these records: the W12 kernels then skip their escape
        path (wrong results, timing only: what that path costs)."""
        esc = torch.zeros(0, 2, dtype=torch.int16, device="cuda")
        return (esc, *g.prepare_escapes(torch.zeros_like(self.counts), esc))

    def bytes(self, m, kind):
        nb, kb = self.counts.shape
        x = m * self.k * 2 + m * self.n * 2
        if kind == "w12":
            return nb * kb * 12288 + nb * TN + 4 * nb * kb + 4 * self.nnz + x
        if kind == "view":
            return nb * kb * 8192 + nb * TN + x
        return self.n * self.k * 2 + x


def base_split(n, k):
    return g.pick_config(1, n, k).split


def candidates(n, k, m, view):
    base = g.pick_config(m, n, k, view)
    s = base.split
    splits = sorted({s, 2 * s} | ({1} if s <= 2 else set()))
    out = []
    if m == 1:
        for bm in ((1,) if view else (1, 16)):
            for st in (1, 3):
                for sp in splits:
                    out.append(g.Config(bm=bm, split=sp, num_warps=4, num_stages=st))
        out.append(g.Config(bm=1, split=s, num_warps=8, num_stages=1))
        if view:
            out.append(g.Config(bm=1, split=2 * s, num_warps=8, num_stages=1))
        return out
    bm = g._m_bucket(m)
    out = [g.Config(bm, sp, 4, 3) for sp in splits] + [g.Config(bm, s, 4, 1), g.Config(bm, s, 4, 3, 1)]
    if m == 128:
        out.append(g.Config(64, s, 4, 3))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true",
                    help="also sweep the Triton kernel's configs per shape and M; writes OUT/table.py")
    ap.add_argument("--cuda-sweep", action="store_true",
                    help="also sweep the CUDA skinny kernel's configs (M of --sweep-ms); writes OUT/cuda_table.py")
    ap.add_argument("--out", default=os.environ.get("OUT", "."),
                    help="folder for the results table (default: $OUT, else the current folder)")
    ap.add_argument("--shapes", type=int, default=len(SHAPES),
                    help=f"run the first this many of the {len(SHAPES)} shapes (default: all)")
    ap.add_argument("--sweep-ms", default="1,16,32,64", help="--cuda-sweep: the M values swept (comma-separated)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)  # before the first case: a run is not lost for want of its folder
    torch.backends.cuda.matmul.allow_tf32 = False
    t_start = time.time()
    dev = torch.cuda.get_device_name()
    print(f"device {dev}, torch {torch.__version__}, triton {triton.__version__}")

    # ---- 1. the GPU encoder against the reference on a small matrix with specials
    w = make_weight(300, 200, 7)
    w.view(-1)[:6] = torch.tensor([0.0, -0.0, 1e-39, 100.0, float("inf"), -3e4], dtype=torch.bfloat16)
    ref_enc = fmt.encode(w.view(torch.int16).cpu())
    gpu_enc = encode_gpu(w.view(torch.int16))
    assert all(torch.equal(a, b.cpu()) for a, b in zip(ref_enc, gpu_enc)), "GPU encoder != reference encoder"
    print("GPU encoder == reference encoder (300x200 with specials)")

    # ---- 2a. identity product: every in-window weight bit-exact, PTX and portable decode
    n, k = 300, 256
    w = make_weight(n, k, 3)
    w.view(-1)[::997] = torch.tensor(100.0, dtype=torch.bfloat16)
    enc = Mat.__new__(Mat)
    enc.n, enc.k, enc.w = n, k, w
    enc.records, enc.exps, enc.counts, enc.escapes = encode_gpu(w.view(torch.int16))
    enc.offs, enc.cols = g.prepare_escapes(enc.counts, enc.escapes)
    eye = torch.eye(k, device="cuda", dtype=torch.bfloat16)
    rows, cols = fmt.escape_coordinates(enc.counts.cpu(), enc.escapes.cpu())
    esc = torch.zeros(n, k, dtype=torch.bool, device="cuda")
    esc[rows.cuda(), cols.cuda()] = True
    for ptx in (True, False):
      try:
        for cfg in (g.Config(128, 1, 8), g.Config(128, 2, 4), g.Config(1, 1, 4), g.Config(16, 2, 4)):
            yt = enc.run(eye, cfg=cfg, use_ptx=ptx).t()
            assert torch.equal(yt.view(torch.int16)[~esc], w.view(torch.int16)[~esc]), f"decode ptx={ptx} {cfg}"
            assert torch.allclose(yt[esc].float(), w[esc].float(), rtol=2**-8, atol=1e-6)
            wq = decode_gpu(enc.records, enc.exps, enc.counts, enc.escapes, n, k, view=True)
            yq = enc.run(eye, view=True, cfg=cfg, use_ptx=ptx).t()
            assert torch.equal(yq.view(torch.int16)[~esc], wq.view(torch.int16)[~esc]), f"view decode ptx={ptx}"
      except Exception:
        import traceback
        traceback.print_exc()
        if not ptx:
            raise
        print("PTX PATH FAILED: falling back to the portable decode for the rest of this run")
        g.USE_PTX = False
    print("identity product: decoded weights bit-exact (W12 and view; PTX and portable paths)")
    cuda_ok = gc.library() is not None
    print(f"CUDA skinny kernel available: {cuda_ok}")
    if cuda_ok:
        wq = decode_gpu(enc.records, enc.exps, enc.counts, enc.escapes, n, k, view=True)
        tiled = (gc.CudaConfig(8, 8, 2), gc.CudaConfig(1, 4, 2), gc.CudaConfig(2, 8, 1), gc.CudaConfig(4, 4, 2),
                 gc.CudaConfig(1, 4, 1), gc.CudaConfig(1, 8, 1, 4), gc.CudaConfig(2, 4, 1, 2), gc.CudaConfig(8, 8, 1, 3),
                 gc.CudaConfig(1, 4, 1, 1, 100), gc.CudaConfig(1, 8, 2, 2, 50),
                 gc.WsConfig(2), gc.WsConfig(4, 3), gc.WsConfig(8, 2), gc.WsConfig(16), gc.WsConfig(16, 2))
        # the stream kernel where a table dispatches it (bench/stream_kernel.py checks it in a child process first)
        streams = ((gc.StreamConfig(2, 4), 8), (gc.StreamConfig(2, 3, True), 16), (gc.StreamConfig(1, 5), 32),
                   (gc.StreamConfig(3, 4, warps=4), 8), (gc.StreamConfig(2, 4, warps=4), 32)) if gc.STREAM_TABLE else ()
        for cfg, mm in [(c, 8 * c.nt) for c in tiled] + list(streams):  # mm: X rows per call
            for j in range(0, k, mm):
                xe = eye[j:j + mm].contiguous()
                yt = enc.run(xe, cuda=cfg).t()
                sl = slice(j, j + mm)
                assert torch.equal(yt.view(torch.int16)[~esc[:, sl]], w[:, sl].view(torch.int16)[~esc[:, sl]]), f"cuda decode {cfg}"
                assert torch.allclose(yt[esc[:, sl]].float(), w[:, sl][esc[:, sl]].float(), rtol=2**-8, atol=1e-6)
                yq = enc.run(xe, view=True, cuda=cfg).t()
                assert torch.equal(yq.view(torch.int16)[~esc[:, sl]], wq[:, sl].contiguous().view(torch.int16)[~esc[:, sl]]), f"cuda view {cfg}"
        print("identity product: CUDA kernel decoded weights bit-exact (W12 and view)")

    # ---- 2b. every shape: lossless round trip, errors vs reference, determinism
    shapes = SHAPES[: args.shapes]
    mats, checks = {}, {}
    for si, (n, k) in enumerate(shapes):
        mt = Mat(n, k, 100 + si)
        wd = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, n, k)
        assert torch.equal(wd.view(torch.int16), mt.w.view(torch.int16)), f"round trip {n}x{k}"
        wf = wd.float()
        wq = decode_gpu(mt.records, mt.exps, mt.counts, mt.escapes, n, k, view=True).float()
        err = {"w12": 0.0, "view": 0.0, "w12_portable": 0.0, "det": True}
        for m in MS:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref, refq = x.float() @ wf.t(), x.float() @ wq.t()
            y, yq = mt.op(x), mt.op(x, view=True)
            err["w12"] = max(err["w12"], rel(y, ref))
            err["view"] = max(err["view"], rel(yq, refq))
            err["triton"] = max(err.get("triton", 0.0), rel(mt.run(x), ref))
            if m in (1, 16, 128) and si < 3:
                err["w12_portable"] = max(err["w12_portable"], rel(mt.run(x, use_ptx=False), ref))
            for _ in range(9):
                err["det"] &= torch.equal(mt.op(x), y) and torch.equal(mt.op(x, view=True), yq)
            if args.cuda_sweep and cuda_ok and m <= 64:
                for cfg in cuda_candidates(m):
                    y1 = mt.run(x, cuda=cfg)
                    e1, e2 = rel(y1, ref), rel(mt.run(x, view=True, cuda=cfg), refq)
                    assert e1 < 1e-2 and e2 < 1e-2, f"cuda {cfg} M={m} {n}x{k}: rel err {e1:.2e} {e2:.2e}"
                    if cfg.split > 1:
                        assert all(torch.equal(mt.run(x, cuda=cfg), y1) for _ in range(3)), f"split-K not deterministic {cfg}"
        del wf, wq, wd
        checks[(n, k)] = err
        mats[(n, k)] = mt
        print(f"check {n}x{k}: nnz={mt.nnz} max rel err w12 {err['w12']:.2e} triton {err['triton']:.2e} view {err['view']:.2e} "
              f"portable {err['w12_portable']:.2e} bitwise-deterministic x10 {err['det']}")
        assert err["w12"] < 1e-2 and err["view"] < 1e-2 and err["det"], "correctness check failed"
    torch.cuda.empty_cache()

    # ---- 2c. CUDA graph capture and torch.compile of the op
    mt = mats[shapes[1]]
    x = torch.randn(1, mt.k, device="cuda").to(torch.bfloat16)
    f = lambda x: ops.matmul(x, mt.records, mt.exps, mt.escapes, mt.offs, mt.cols, mt.n)  # noqa: E731
    y0 = f(x)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        yg = f(x)
    gr.replay()
    torch.cuda.synchronize()
    graph_ok = torch.equal(yg, y0)
    try:
        fc = torch.compile(f, fullgraph=True)
        comp_ok = torch.equal(fc(x), y0)
    except Exception as e:  # report, don't hide
        comp_ok = f"failed: {type(e).__name__}: {e}"[:200]
    print(f"CUDA graph replay equal: {graph_ok}; torch.compile(fullgraph) equal: {comp_ok}")

    # ---- 3. sweep
    if args.sweep:
        best = {}
        for (n, k), mt in mats.items():
            for m, view in ((1, False), (1, True), (16, False), (32, False), (64, False), (128, False)):
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                res = []
                for cfg in candidates(n, k, m, view):
                    try:
                        res.append((bench(lambda: mt.run(x, view=view, cfg=cfg), rep=20), cfg))
                    except Exception as e:
                        print(f"  config {cfg} failed: {type(e).__name__}: {str(e)[:150]}")
                if m == 1:
                    c0 = g.Config(1, base_split(n, k), 4, 1, 0)
                    res.append((bench(lambda: mt.run(x, view=view, cfg=c0), rep=20), "portable"))
                res.sort(key=lambda r: r[0])
                cfgs = [r for r in res if isinstance(r[1], g.Config)]
                best[(n, k, g._m_bucket(m), view)] = cfgs[0][1]
                print(f"sweep {n}x{k} M={m} view={view}: " + ", ".join(
                    f"{t:.1f}" + ("" if not isinstance(c, g.Config) else f"[{c.bm},{c.split},{c.num_warps},{c.num_stages},{c.ptx}]")
                    + ("" if isinstance(c, g.Config) else f"({c})") for t, c in res[:6]))
        g.TABLE.update(best)
        with open(os.path.join(args.out, "table.py"), "w") as fh:
            fh.write("TABLE = {\n")
            for key, c in best.items():
                fh.write(f"    {key}: Config({c.bm}, {c.split}, {c.num_warps}, {c.num_stages}, {c.ptx}),\n")
            fh.write("}\n")

    if args.cuda_sweep and cuda_ok:
        best = {}
        sweep_mats = dict(mats)
        for si, (n, k) in enumerate(HF_SHAPES):  # Transformers' separate k/v and gate/up projections
            if (n, k) not in sweep_mats:
                mt = Mat(n, k, 300 + si)
                x = torch.randn(16, k, device="cuda").to(torch.bfloat16)
                ref = x.float() @ mt.w.float().t()
                for cfg in cuda_candidates(16) + cuda_candidates(1):
                    assert rel(mt.run(x, cuda=cfg), ref) < 1e-2, f"cuda {cfg} {n}x{k}"
                sweep_mats[(n, k)] = mt
        for (n, k), mt in sweep_mats.items():
            for m in [int(v) for v in args.sweep_ms.split(",")]:
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                for view in (False, True):
                    res = sorted(((bench(lambda: mt.run(x, view=view, cuda=c), clean=True), c) for c in cuda_candidates(m)),
                                 key=lambda r: r[0])
                    key = (n, k, 8 * gc._nt_for(m), view)
                    if key not in best or m == 8 * gc._nt_for(m):
                        best[key] = res[0][1]
                    print(f"cuda sweep {n}x{k} M={m} view={view}: " + ", ".join(
                        f"{t:.1f}[{c.nt},{c.warps},{c.unroll},{c.split}]" for t, c in res[:5]))
        gc.TABLE.update(best)
        with open(os.path.join(args.out, "cuda_table.py"), "w") as fh:
            fh.write("TABLE = {\n")
            for key, c in best.items():
                fh.write(f"    {key}: CudaConfig({c.nt}, {c.warps}, {c.unroll}, {c.split}, {c.l2}, {c.xreg}),\n")
            fh.write("}\n")

    # ---- 3b. diagnostics: what a tiny call costs (launch + ramp floor) and what the escape epilogue costs
    diag = []
    if cuda_ok:
        tiny = Mat(128, 64, 5)
        xt = torch.randn(1, 64, device="cuda").to(torch.bfloat16)
        diag.append(("floor: W12 CUDA 128x64 M=1", bench(lambda: tiny.op(xt), clean=True)))
        diag.append(("floor: cuBLAS 128x64 M=1", bench(lambda: torch.matmul(xt, tiny.w.t()), clean=True)))
        for (n, k) in shapes[:3]:
            mt = mats[(n, k)]
            x1 = torch.randn(1, k, device="cuda").to(torch.bfloat16)
            no_esc, no_offs, no_cols = mt.no_escapes()
            cfg = gc.pick_config(1, n, k)
            diag.append((f"{n}x{k} M=1 W12 CUDA", bench(lambda: mt.op(x1), clean=True)))
            diag.append((f"{n}x{k} M=1 W12 CUDA, escape epilogue skipped (wrong result, timing only)", bench(
                lambda: gc.launch(x1, mt.records, mt.exps, n, no_esc, no_offs, no_cols, config=cfg), clean=True)))
            diag.append((f"{n}x{k} M=1 view CUDA", bench(lambda: mt.op(x1, view=True), clean=True)))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for (n, k), mt in mats.items():  # M = 1: how many waves the dispatched skinny config runs in
            try:
                cfg, x1 = gc.pick_config(1, n, k), torch.randn(1, k, device="cuda").to(torch.bfloat16)
                ctas, per_sm = (n + 127) // 128 * 8 * cfg.split, gc.blocks_per_sm(cfg)
                diag.append((f"{n}x{k} M=1 {cfg}: {ctas} CTAs, {per_sm} per SM -> {ctas / (per_sm * sms):.2f} waves "
                             "(value: µs of the W12 call)", bench(lambda: mt.op(x1), clean=True)))
            except Exception as e:  # a diagnostic: report, go on
                print(f"diag waves {n}x{k}: {type(e).__name__}: {e}")
        for name, t in diag:
            print(f"diag {t:8.1f} µs  {name}")

    # ---- 4. timing
    rows = []
    for (n, k), mt in mats.items():
        wb = mt.w
        for m in MS:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            t_cb = bench(lambda: torch.matmul(x, wb.t()))
            t_w = bench(lambda: mt.op(x))
            t_t = bench(lambda: mt.run(x))
            t_v = bench(lambda: mt.op(x, view=True))
            c_cb = bench(lambda: torch.matmul(x, wb.t()), clean=True)
            c_w = bench(lambda: mt.op(x), clean=True)
            c_v = bench(lambda: mt.op(x, view=True), clean=True)
            kind = gc.kernel_for(m, n, k) if gc.usable(x, mt.records, mt.exps, n) else None
            c = g.pick_config(m, n, k)
            if kind == "skinny":
                cc = gc.pick_config(m, n, k)
                c = (f"cuda {cc.nt}/{cc.warps}/{cc.unroll}/{cc.split}" + (f" l2 {cc.l2}" if cc.l2 else "")
                     + (" xreg" if cc.xreg else ""))
            elif kind == "ws":
                cc = gc.dispatched_config(m, n, k)
                c = f"cuda-ws {cc.nt}/{cc.split}" + (f" tail {cc.tail}" if cc.tail > 1 else "")
            elif kind == "stream":
                cc = gc.dispatched_config(m, n, k)
                c = "cuda-" + stream_name(cc)
            else:
                c = f"triton {c.bm}/{c.split}/{c.num_warps}/{c.num_stages}/{c.ptx}"
            rows.append(dict(n=n, k=k, m=m, cublas=t_cb, w12=t_w, triton=t_t, view=t_v,
                             c_cublas=c_cb, c_w12=c_w, c_view=c_v,
                             tb_cublas=mt.bytes(m, "bf16") / t_cb / 1e6, tb_w12=mt.bytes(m, "w12") / t_w / 1e6,
                             tb_view=mt.bytes(m, "view") / t_v / 1e6, cfg=c))
    write_results(rows, checks, args, dev, graph_ok, comp_ok, time.time() - t_start, diag)


def cuda_candidates(m):
    nts = {gc._nt_for(m)} | ({gc._nt_for(m) // 2} if m > 8 else set())
    wus = [(w, 1, sp) for w in (4, 8) for sp in (1, 2, 3, 4, 5, 6, 8)] + [(8, 2, 1)]  # 3/5/6: grids between waves
    wus += [(4, 2, 1), (4, 2, 2), (8, 2, 2)] + ([] if m <= 8 else [(4, 2, 3), (4, 2, 4)])  # 2 records per stage
    xreg = [gc.CudaConfig(4, w, 1, sp, xreg=True) for w in (4, 8) for sp in (1, 2)] if 4 in nts else []
    return [gc.CudaConfig(nt, w, u, sp) for nt in sorted(nts) for (w, u, sp) in wus] + xreg


def geo(v):
    """Geometric mean of the measured values (NaN: not measured, left out; nan when none is)."""
    v = [a for a in v if a == a]
    return math.exp(sum(math.log(a) for a in v) / len(v)) if v else float("nan")


def stream_name(c) -> str:
    """A StreamConfig as the tables print it: "stream CTAs per SM/stages [w4] [ef] [al]"."""
    return (f"stream {c.ctas_per_sm}/{c.stages}" + (f" w{c.warps}" if c.warps != 8 else "")
            + (" ef" if c.evict_first else "") + (" al" if c.aligned else ""))


def write_results(rows, checks, args, dev, graph_ok, comp_ok, secs, diag=()):
    today = datetime.date.today().isoformat()
    head = commit(short=False)
    dirty = os.environ.get("W12_DIRTY", "")
    cmd = os.environ.get("W12_CMD", "PYTHONUNBUFFERED=1 python bench/kernels.py " + " ".join(sys.argv[1:]))
    L = [f"# W12 kernels vs cuBLAS BF16 — {today}", "",
         f"- GPU: {dev}; torch {torch.__version__}; triton {triton.__version__}",
         f"- commit: {head}" + (" (working tree had uncommitted kernel changes)" if dirty else ""),
         f"- command: `{cmd}`",
         "- timing: each call captured in a CUDA graph, replays timed by triton.testing.do_bench (launches queued, L2 flushed, median); µs; TB/s = bytes read / time",
         "  (W12: 12 KB/record + exponents + counts + escapes + x + y; view: 8 KB/record; cuBLAS: 2·N·K + x + y)",
         f"- checks: CUDA graph replay equal {graph_ok}; torch.compile(fullgraph) equal {comp_ok}; wall {secs:.0f} s", "",
         "## Correctness (max over M of ‖y − ref‖∞/‖ref‖∞ against decoded weights → fp32 matmul)", "",
         "| N×K | W12 | view (vs view ref) | W12 portable decode | bitwise equal over 10 runs |", "|---|---|---|---|---|"]
    for (n, k), e in checks.items():
        L.append(f"| {n}×{k} | {e['w12']:.2e} | {e['view']:.2e} | {e['w12_portable']:.2e} | {e['det']} |")
    if diag:
        L += ["", "## Diagnostics (clean flush, µs)", ""] + [f"- {t:.1f} µs: {name}" for name, t in diag]
    L += ["", "## Summary: ratio = cuBLAS µs / kernel µs (geomean over shapes)", "",
          "| M | W12 geomean | W12 min | view geomean | view min | Triton W12 geomean | clean flush: W12 geomean | W12 min | view geomean |",
          "|---|---|---|---|---|---|---|---|---|"]
    for m in MS:
        r = [x for x in rows if x["m"] == m]
        a = [x["cublas"] / x["w12"] for x in r]
        b = [x["cublas"] / x["view"] for x in r]
        c = [x["cublas"] / x["triton"] for x in r]
        d = [x["c_cublas"] / x["c_w12"] for x in r]
        e = [x["c_cublas"] / x["c_view"] for x in r]
        L.append(f"| {m} | {geo(a):.3f} | {min(a):.3f} | {geo(b):.3f} | {min(b):.3f} | {geo(c):.3f} | "
                 f"{geo(d):.3f} | {min(d):.3f} | {geo(e):.3f} |")
    L += ["", "## Full table", "",
          "| N×K | M | cuBLAS µs | W12 µs | view µs | W12/cuBLAS | view/cuBLAS | Triton W12/cuBLAS | cuBLAS TB/s | W12 TB/s | view TB/s | clean: cuBLAS µs | W12 µs | view µs | W12/cuBLAS | W12 TB/s | W12 kernel config |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        L.append(f"| {x['n']}×{x['k']} | {x['m']} | {x['cublas']:.1f} | {x['w12']:.1f} | {x['view']:.1f} | "
                 f"{x['cublas'] / x['w12']:.3f} | {x['cublas'] / x['view']:.3f} | {x['cublas'] / x['triton']:.3f} | {x['tb_cublas']:.2f} | "
                 f"{x['tb_w12']:.2f} | {x['tb_view']:.2f} | {x['c_cublas']:.1f} | {x['c_w12']:.1f} | {x['c_view']:.1f} | "
                 f"{x['c_cublas'] / x['c_w12']:.3f} | {x['tb_w12'] * x['w12'] / x['c_w12']:.2f} | {x['cfg']} |")
    md = "\n".join(L) + "\n"
    card = "".join(w for w in torch.cuda.get_device_name().lower().split() if w[:1] == "h" and w[1:4].isdigit())
    path = os.path.join(args.out, f"{today}-kernels-{card or 'gpu'}.md")  # the card: h100, h200
    with open(path, "w") as fh:
        fh.write(md)
    with open(os.path.join(args.out, "rows.json"), "w") as fh:
        json.dump(rows, fh)
    # short table last
    print("\nN×K            | M=1 W12  TB/s | M=1 view | M=32 W12 | M=128 W12 | clean M=1 W12 TB/s view | M=16 | M=32")
    for (n, k) in checks:
        def r_(m, key="w12"):
            x = next(x for x in rows if x["n"] == n and x["k"] == k and x["m"] == m)
            return x["cublas"] / x[key], x["tb_" + key]
        def c_(m, key="w12"):
            x = next(x for x in rows if x["n"] == n and x["k"] == k and x["m"] == m)
            return x["c_cublas"] / x["c_" + key], x["tb_" + key] * x[key] / x["c_" + key]
        a, tb = r_(1)
        print(f"{n:>6}x{k:<6}   | {a:5.2f} {tb:5.2f}  | {r_(1, 'view')[0]:5.2f}    | {r_(32)[0]:5.2f}    | {r_(128)[0]:5.2f}     | "
              f"{c_(1)[0]:5.2f} {c_(1)[1]:5.2f} {c_(1, 'view')[0]:5.2f} | {c_(16)[0]:5.2f} | {c_(32)[0]:5.2f}")
    for m in (1, 32, 128):
        r = [x for x in rows if x["m"] == m]
        print(f"M={m}: W12 geomean {geo([x['cublas'] / x['w12'] for x in r]):.3f} min "
              f"{min(x['cublas'] / x['w12'] for x in r):.3f}; view geomean {geo([x['cublas'] / x['view'] for x in r]):.3f}"
              f" | clean flush: W12 geomean {geo([x['c_cublas'] / x['c_w12'] for x in r]):.3f} min "
              f"{min(x['c_cublas'] / x['c_w12'] for x in r):.3f}; view geomean {geo([x['c_cublas'] / x['c_view'] for x in r]):.3f}")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
