"""Cost model of speculative decoding (seed paper §3.2): where the speed goes, and how much is left.

    speed-up over AR      S(N) = τ(N) / c(N),      c(N) = T_step(N) / T_AR
    byte floor per kernel F_k = max(FLOPs_k / (0.6 · peak FLOP/s), bytes_k / (0.9 · peak B/s))
    ceiling               S* = S(N) · f_tree · f_kernels · f_outside
        f_tree    = τ_best / τ(N)            a better tree (τ that any tree could accept, e.g. the oracle)
        f_kernels = Σ t_k / Σ F_k            faster kernels (profiled time over the byte floor)
        f_outside = T_step(N) / Σ t_k        less time outside the profiled kernels
The largest factor names what to attack next. All times in seconds.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense BF16 FLOP/s
    bandwidth: float  # bytes/s


# H100 SXM: datasheet (989 TFLOP/s dense BF16, 3.35 TB/s, the paper's figures). H200: the same chip's
# FLOP/s, and the read bandwidth measured on the lent H200 (4.02 TB/s, ../shared/DESIGN.md).
PRESETS = {"H100": GPU("H100", 989e12, 3.35e12), "H200": GPU("H200", 989e12, 4.02e12)}


@dataclass(frozen=True)
class Kernel:
    name: str
    time: float
    bytes: float = 0.0
    flops: float = 0.0

    def floor(self, gpu: GPU) -> float:
        return max(self.flops / (0.6 * gpu.peak_flops), self.bytes / (0.9 * gpu.bandwidth))


@dataclass
class Profile:
    """One configuration: AR step time, step time and τ per node budget N, and one step's kernels."""
    gpu: GPU
    t_ar: float
    t_step: dict[int, float]
    tau: dict[int, float]
    kernels: list[Kernel] = field(default_factory=list)
    tau_best: float | None = None  # τ any tree could accept (oracle); None: no tree factor


def relative_cost(p: Profile, n: int) -> float:
    return p.t_step[n] / p.t_ar


def speedup(p: Profile, n: int) -> float:
    return p.tau[n] / relative_cost(p, n)


def best_budget(p: Profile) -> int:
    return max(p.tau, key=lambda n: speedup(p, n))


def ceiling(p: Profile, n: int) -> dict:
    """The three factors, their product with S(N), and which one is largest."""
    t_prof = sum(k.time for k in p.kernels)
    t_floor = sum(k.floor(p.gpu) for k in p.kernels)
    factors = {
        "tree": (p.tau_best / p.tau[n]) if p.tau_best else 1.0,
        "kernels": t_prof / t_floor if p.kernels else 1.0,
        "outside": p.t_step[n] / t_prof if p.kernels else 1.0,
    }
    s = speedup(p, n)
    return {"n": n, "speedup": s, "relative_cost": relative_cost(p, n), **{f"f_{k}": v for k, v in factors.items()},
            "ceiling": s * factors["tree"] * factors["kernels"] * factors["outside"],
            "attack": max(factors, key=factors.get)}


def cycle_time(stages: dict[str, float]) -> float:
    """A multi-stage cycle (e.g. TLV: two drafts, Q pass, exact pass, append) costs the sum of its stages."""
    return sum(stages.values())


def tokens_per_second(tokens_per_cycle: float, stages: dict[str, float]) -> float:
    return tokens_per_cycle / cycle_time(stages)


def tlv_break_even(q_fraction: float) -> float:
    """Tokens per TLV cycle over tokens per single-pass step needed to break even, when the Q pass costs
    `q_fraction` of a step and the exact pass one step: (q·T + T) / T = 1 + q (paper §6: 0.80–0.88 →
    "nearly twice")."""
    return 1.0 + q_fraction


def profile_from_dict(d: dict) -> Profile:
    """A profile from JSON: {"gpu": "H100" | {"name","peak_flops","bandwidth"}, "t_ar", "t_step": {N: s},
    "tau": {N: τ}, "kernels": [{"name","time","bytes","flops"}], "tau_best"}; times in seconds."""
    gpu = d.get("gpu", "H200")
    gpu = PRESETS[gpu] if isinstance(gpu, str) else GPU(**gpu)
    if "peak_flops" in d or "bandwidth" in d:
        gpu = GPU(gpu.name, float(d.get("peak_flops", gpu.peak_flops)), float(d.get("bandwidth", gpu.bandwidth)))
    return Profile(gpu, float(d["t_ar"]), {int(k): float(v) for k, v in d["t_step"].items()},
                   {int(k): float(v) for k, v in d["tau"].items()},
                   [Kernel(**k) for k in d.get("kernels", [])], d.get("tau_best"))
