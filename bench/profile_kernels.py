"""Hardware counters of the W12 CUDA kernels next to cuBLAS, for a few shapes (Nsight Compute).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section Occupancy --section LaunchStats [--metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct] \
        -o prof python bench/profile_kernels.py 2> names.txt
    ncu --import prof.ncu-rep --csv --page details > details.csv; ncu --import prof.ncu-rep --csv --page raw > raw.csv
    python bench/profile_kernels.py --summarize details.csv --raw raw.csv --names names.txt
    python bench/profile_kernels.py --pipes raw.csv --names names.txt   # tensor / ALU / LSU pipes, issue, shared memory
                                        # (profile with --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables)

With --configs "4/4/1/1x,2/4/1/1" (nt/warps/unroll/split, x: the xreg form) every M of --cases runs those skinny configs
beside cuBLAS instead of the dispatched kernels — e.g. an nt = 4 build at 1 and at 32 rows (bench/skinny_rows.py).

At M > 8 the ws kernel is profiled too (W12, then the 8-bit view: the same ring with 8 KB records and no escapes), with
WS_TABLE's config for the shape or else ws_rule_config's.  It launches
an X-reordering kernel first:
profile with --kernel-name regex:"gemm|gemv|nvjet|reduce" (reduce: the read floor's torch.sum at M = 1) so that the
n-th profiled kernel stays the n-th variant.
Each variant is checked against the reference (decode + fp32 matmul) and warmed up before the profiler
starts, then launched once inside cudaProfilerStart/Stop, in the order of VARIANTS (printed to stderr),
so the n-th profiled kernel is the n-th variant.
"""

import argparse
import csv
import os
import sys

import torch


DEFAULT_CASES = "4096x4096:1,128;28672x4096:1,32"


def parse_cases(text: str):
    """"NxK:M,M;NxK:M" -> [((n, k), (m, ...)), ...]"""
    out = []
    for part in text.split(";"):
        shape, ms = part.split(":")
        n, k = (int(v) for v in shape.split("x"))
        out.append(((n, k), tuple(int(m) for m in ms.split(","))))
    return out


def parse_configs(text: str) -> list:
    """"4/4/1/1x,2/4/1/1" -> [CudaConfig(4, 4, 1, 1, xreg=True), CudaConfig(2, 4, 1, 1)]"""
    from w12.kernels import gemm_cuda as gc
    out = []
    for part in text.split(","):
        nt, warps, unroll, split = (int(v) for v in part.rstrip("x").split("/"))
        out.append(gc.CudaConfig(nt, warps, unroll, split, xreg=part.endswith("x")))
    return out


def variants(cases=DEFAULT_CASES, configs=None):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernels import Mat, rel  # bench/kernels.py

    from w12.kernels import gemm_cuda as gc

    out = []
    for (n, k), ms in parse_cases(cases):
        mt = Mat(n, k, 7)
        wf = mt.w.float()
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = x.float() @ wf.t()
            cands = [("cuBLAS", lambda x=x, mt=mt: torch.matmul(x, mt.w.t()))]
            if configs:
                cands += [(f"skinny {c}", lambda x=x, mt=mt, c=c: mt.run(x, cuda=c)) for c in configs]
            elif m == 1:  # a generic streaming read of the same record bytes (PyTorch's reduction), for scale
                cands.append(("read floor: records.sum()", lambda mt=mt: mt.records.view(torch.int64).sum()))
            if m <= 64 and not configs:
                cands.append((f"skinny {gc.pick_config(m, n, k)}", lambda x=x, mt=mt, c=gc.pick_config(m, n, k): mt.run(x, cuda=c)))
                cands.append(("skinny view", lambda x=x, mt=mt, c=gc.pick_config(m, n, k, True): mt.run(x, view=True, cuda=c)))
            if m > 8 and not configs:  # the ws kernel: WS_TABLE's (or W12_WS_TABLE's) config, else the rule's
                c = gc.WS_TABLE.get((n, k, gc.m_bucket(m))) or gc.ws_rule_config(m, n, k)
                cands.append((f"ws {c}", lambda x=x, mt=mt, c=c: mt.run(x, cuda=c)))
                cands.append((f"ws view {c}", lambda x=x, mt=mt, c=c: mt.run(x, view=True, cuda=c)))
            for name, fn in cands:
                y = fn()
                if "view" not in name and "floor" not in name:
                    e = rel(y, ref)
                    assert e < 1e-2, f"{name} {n}x{k} M={m}: rel err {e}"
                out.append((f"{n}x{k} M={m} {name}", fn))
    return out


def run(cases=DEFAULT_CASES, configs=None):
    vs = variants(cases, configs)
    for _, fn in vs:  # warm up (builds, tickets) outside the profiled range
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in vs:
        print(f"variant: {name}", file=sys.stderr)
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


KEEP = {
    "Duration": "µs", "DRAM Throughput": "dram%", "Memory Throughput": "mem%", "Compute (SM) Throughput": "sm%",
    "L2 Cache Throughput": "l2%", "Achieved Occupancy": "occ%", "Registers Per Thread": "regs", "Block Limit Registers": "blk/reg",
    "Block Limit Shared Mem": "blk/smem", "Warp Cycles Per Issued Instruction": "cyc/issue",
    "Issued Warp Per Scheduler": "issue/sch", "Grid Size": "grid", "Block Size": "block",
    # with --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct (what DRAM delivered, against the weights' bytes)
    "dram__bytes_read.sum": "DRAM read", "lts__t_sector_hit_rate.pct": "L2 hit%",
}


def read_raw(path):
    """(metric names, units, one row per profiled kernel) of an ncu --page raw CSV."""
    with open(path) as fh:
        rd = list(csv.reader([l for l in fh if l.startswith('"')]))
    return rd[0], rd[1], rd[2:]


def read_names(path) -> list:
    """The variants of a profiled run, in order (its 'variant:' lines on stderr)."""
    return [l.split("variant: ", 1)[1].strip() for l in open(path) if "variant: " in l] if path else []


def stalls(path):
    """Per profiled kernel (in order): the top warp-stall reasons, cycles per issued instruction, from
    ncu --page raw (smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio)."""
    head, _, data = read_raw(path)
    pre, suf = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    cols = [(i, h[len(pre):-len(suf)]) for i, h in enumerate(head) if h.startswith(pre) and h.endswith(suf)]
    out = []
    for row in data:
        vals = sorted(((float(row[i].replace(",", "") or 0), n) for i, n in cols), reverse=True)
        out.append(", ".join(f"{n} {v:.1f}" for v, n in vals[:4]))
    return out


def summarize(path, names, raw=None):
    """One line per profiled kernel: the KEEP metrics (ncu --csv --page details) and the top stalls."""
    rows = {}
    order = []
    with open(path) as fh:
        lines = [l for l in fh if l.startswith('"')]
    for r in csv.DictReader(lines):
        key = (r["ID"], r["Kernel Name"][:40])
        if key not in rows:
            rows[key] = {}
            order.append(key)
        if r["Metric Name"] in KEEP:
            unit = r.get("Metric Unit", "") if r["Metric Name"].startswith("dram__bytes") else ""
            rows[key][KEEP[r["Metric Name"]]] = f"{r['Metric Value']} {unit}".strip()
    cols = list(KEEP.values())
    st = stalls(raw) if raw else []
    print("| variant | kernel | " + " | ".join(cols) + " | top stalls (cycles per issue) |")
    print("|---" * (len(cols) + 3) + "|")
    v = -1
    for i, key in enumerate(order):
        helper = "splitKreduce" in key[1]  # cuBLAS's second kernel of a split-K call: the same variant
        v += 0 if helper else 1
        name = (names[v] if v < len(names) else "?") + (" (2nd kernel)" if helper else "")
        print(f"| {name} | {key[1]} | " + " | ".join(rows[key].get(c, "") for c in cols) +
              f" | {st[i] if i < len(st) else ''} |")


PIPES = ("pipe_tensor", "pipe_alu", "pipe_fma", "pipe_lsu", "pipe_uniform", "data_pipe_lsu_wavefronts",
         "issue_active", "sm__throughput", "l1tex__throughput", "lts__throughput", "dram__throughput",
         "gpu__time_duration")


def pipes(raw, names) -> None:
    """Per profiled kernel (a column each), every ncu --page raw metric whose name holds one of PIPES: how busy the
    tensor, ALU, FMA and load/store pipes, the shared-memory wavefronts and the issue slots were (profile with
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SpeedOfLight)."""
    head, units, data = read_raw(raw)
    cols = [i for i, h in enumerate(head) if any(k in h for k in PIPES) and (h.endswith(".pct") or
            h.endswith("pct_of_peak_sustained_active") or h.endswith("pct_of_peak_sustained_elapsed") or
            h.startswith("gpu__time_duration.sum"))]
    kernel = head.index("Kernel Name")
    label = [(names[i] if i < len(names) else "?") + f" ({row[kernel][:28]})" for i, row in enumerate(data)]
    print("| metric | " + " | ".join(label) + " |")
    print("|---" * (len(label) + 1) + "|")
    for i in cols:
        print(f"| {head[i]} {units[i]} | " + " | ".join(row[i] for row in data) + " |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--summarize", help="ncu CSV to summarize")
    ap.add_argument("--names", help="file with the 'variant:' lines of the profiled run")
    ap.add_argument("--raw", help="ncu --page raw CSV (stall reasons)")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"shapes and M to profile (default {DEFAULT_CASES!r})")
    ap.add_argument("--configs", help="skinny configs to run at every M instead of the dispatched kernels "
                                      "(nt/warps/unroll/split, x: xreg; comma-separated)")
    ap.add_argument("--pipes", help="ncu --page raw CSV: print the pipe and issue utilisations per kernel (PIPES)")
    a = ap.parse_args()
    if a.pipes:
        pipes(a.pipes, read_names(a.names))
    elif a.summarize:
        summarize(a.summarize, read_names(a.names), a.raw)
    else:
        run(a.cases, parse_configs(a.configs) if a.configs else None)
