"""How fast is this machine's host for a decode loop, and does nvidia-smi polling slow it? (GPU, ~30 s)

Transformers' `generate` synchronises every token, so the host's speed is part of every decode figure
(bench/hf_decode.py). This probe measures, on the GPU machine:

* the host: CPU model, a pure-Python loop (ns per iteration: a speed index to compare machines and days);
* a decode-shaped step: one CUDA graph of `--nodes` small kernels replayed, then a synchronise, `--steps`
  times; wall µs per step, and the host µs of the replay call alone (graph launch);
* the same with `nvidia-smi --query-gpu=clocks.sm,power.draw -lms 50` running beside it (what
  hf_decode's `--gpu-sample` runs), in interleaved rounds — does the NVML poll delay the loop?

    python bench/host_probe.py [--nodes 520,780] [--steps 300] [--rounds 3]
"""

import argparse
import platform
import statistics
import subprocess
import time

import torch


def python_loop_ns(n: int = 2_000_000) -> float:
    t = time.perf_counter()
    acc = 0
    for i in range(n):
        acc += i & 7
    return (time.perf_counter() - t) / n * 1e9


def build_graph(nodes: int):
    """A CUDA graph of `nodes` tiny elementwise kernels (each ~2 µs on the GPU, like a decode step's norms)."""
    x = torch.zeros(4096, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(nodes):
            x.add_(1.0)
    torch.cuda.synchronize()
    return g


def step_loop(g, steps: int) -> tuple:
    """(median wall µs per replay + synchronise, median host µs of the replay call alone)"""
    walls, launches = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        g.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        walls.append((t2 - t0) * 1e6)
        launches.append((t1 - t0) * 1e6)
    return statistics.median(walls), statistics.median(launches)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="520,780", help="kernels per graph (W12's and BF16's decode step: ~523, ~780)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"host: {cpu}; {len(__import__('os').sched_getaffinity(0))} CPUs; Python {platform.python_version()}; "
          f"torch {torch.__version__}; GPU {torch.cuda.get_device_name()}")
    print(f"pure-Python loop: {statistics.median(python_loop_ns() for _ in range(3)):.1f} ns per iteration")
    graphs = {n: build_graph(n) for n in (int(v) for v in args.nodes.split(","))}
    for g in graphs.values():
        step_loop(g, 20)  # warm
    rows = {}
    for r in range(args.rounds):
        for poll in (False, True):
            cmd = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if poll else None
            if proc:
                time.sleep(0.5)
            for n, g in graphs.items():
                rows.setdefault((n, poll), []).append(step_loop(g, args.steps))
            if proc:
                proc.terminate()
                proc.wait()
    print("\n| graph kernels | nvidia-smi poll | wall µs per step (median of rounds) | graph launch host µs "
          "| rounds (wall) |")
    print("|---|---|---|---|---|")
    for (n, poll), v in sorted(rows.items()):
        print(f"| {n} | {'on' if poll else 'off'} | {statistics.median(w for w, _ in v):.0f} | "
              f"{statistics.median(l for _, l in v):.0f} | {', '.join(f'{w:.0f}' for w, _ in v)} |")


if __name__ == "__main__":
    main()
