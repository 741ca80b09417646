"""Paired benchmark (seed paper §3.3): two configurations on the same requests, interleaved and repeated;
the gain with a 95 % confidence interval, and the approval rule

    approve B over A  ⇔  lower bound of the gain's 95 % CI − 1  >  1 %  +  2 · noise(A)

gain = exp(mean over requests of log(t_A / t_B)) (a geometric-mean speed-up of B over A); the interval
is Student's t over requests (each request's log ratio averaged over repeats). noise(A) is A measured
against itself: |exp(mean log(t_A, even repeats / t_A, odd repeats)) − 1|. Order alternates A,B / B,A
from one pair to the next so that drift (clocks, heat, caches) falls on both sides equally.
"""

import math
import statistics
import time
from dataclasses import dataclass

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t95(df: int) -> float:
    """Two-sided 95 % Student-t quantile (table, conservative between entries; 1.96 beyond 120)."""
    if df <= 0:
        return math.inf
    keys = [k for k in sorted(T95) if k <= df]
    return T95[keys[-1]] if df <= 120 else 1.96


@dataclass
class PairedResult:
    gain: float
    ci_low: float
    ci_high: float
    noise_a: float
    approved: bool
    requests: int
    repeats: int

    def summary(self) -> str:
        verdict = "APPROVED" if self.approved else "not approved"
        return (f"gain of B over A {self.gain:.4f}× (95 % CI {self.ci_low:.4f}–{self.ci_high:.4f}), A's own noise "
                f"{self.noise_a:.2%}: {verdict} (needs lower bound > 1 + 1 % + 2 × noise = "
                f"{1 + 0.01 + 2 * self.noise_a:.4f})")


def paired_times(run_a, run_b, requests, repeats: int = 3, clock=time.perf_counter):
    """t[config][repeat][request]: each call timed by `clock`, unless it returns its own time in seconds
    (a system that excludes its start-up); A,B order alternates per pair."""
    times = {"a": [[0.0] * len(requests) for _ in range(repeats)], "b": [[0.0] * len(requests) for _ in range(repeats)]}
    runs = {"a": run_a, "b": run_b}
    for r in range(repeats):
        for i, req in enumerate(requests):
            for side in (("a", "b") if (r + i) % 2 == 0 else ("b", "a")):
                t0 = clock()
                own = runs[side](req)
                times[side][r][i] = own if own is not None else clock() - t0
    return times


def analyse(times_a, times_b) -> PairedResult:
    repeats, n = len(times_a), len(times_a[0])
    d = [statistics.fmean(math.log(times_a[r][i] / times_b[r][i]) for r in range(repeats)) for i in range(n)]
    mean = statistics.fmean(d)
    half = t95(n - 1) * (statistics.stdev(d) / math.sqrt(n) if n > 1 else math.inf)
    if repeats >= 2:
        even = [statistics.fmean(math.log(times_a[r][i]) for r in range(0, repeats, 2)) for i in range(n)]
        odd = [statistics.fmean(math.log(times_a[r][i]) for r in range(1, repeats, 2)) for i in range(n)]
        noise = abs(math.exp(statistics.fmean(e - o for e, o in zip(even, odd))) - 1)
    else:
        noise = math.inf
    low, high = math.exp(mean - half), math.exp(mean + half)
    return PairedResult(math.exp(mean), low, high, noise, low - 1 > 0.01 + 2 * noise, n, repeats)


def paired_benchmark(run_a, run_b, requests, repeats: int = 3, clock=time.perf_counter) -> PairedResult:
    t = paired_times(run_a, run_b, requests, repeats, clock)
    return analyse(t["a"], t["b"])
