"""Cost model (seed paper §3.2) and paired benchmark (§3.3) on known figures and a fake timer."""

import math
import random

import pytest

from w12.specdec.cost_model import (PRESETS, Kernel, Profile, ceiling, cycle_time, profile_from_dict, speedup,
                                    tlv_break_even, tokens_per_second)
from w12.specdec.paired_bench import paired_benchmark


def test_paper_tlv_cycle_arithmetic():
    """H100 TLV cycle: 2×1.05 (drafts) + 11.5 (Q pass) + 14.9 (exact pass) + 1.6 (append) ms = 30.1 ms,
    at 11.67 tokens per exact pass."""
    stages = {"draft1": 1.05e-3, "draft2": 1.05e-3, "q_pass": 11.5e-3, "exact_pass": 14.9e-3, "append": 1.6e-3}
    assert cycle_time(stages) == pytest.approx(30.1e-3)
    assert tokens_per_second(11.67, stages) == pytest.approx(387.7, abs=0.1)


def test_paper_tlv_break_even():
    """Paper §6: a Q pass at 0.80–0.88 of a step needs nearly twice the tokens per cycle to break even."""
    assert tlv_break_even(0.80) == pytest.approx(1.80)
    assert tlv_break_even(0.88) == pytest.approx(1.88)


def test_speedup_and_ceiling_factors():
    # paper §2.1/§2.4 figures: 23.61 ms step of which 80 % reads weights; chain τ 4.25, oracle 6.42
    gpu = PRESETS["H100"]
    weights = Kernel("weights", time=0.80 * 23.61e-3, bytes=0.80 * 23.61e-3 * 0.85 * gpu.bandwidth)
    other = Kernel("attention+misc", time=0.15 * 23.61e-3, bytes=1e9, flops=1e12)
    p = Profile(gpu, t_ar=20e-3, t_step={8: 23.61e-3}, tau={8: 4.25}, kernels=[weights, other], tau_best=6.42)
    c = ceiling(p, 8)
    assert c["relative_cost"] == pytest.approx(23.61 / 20)
    assert c["speedup"] == pytest.approx(4.25 / (23.61 / 20))
    assert c["f_tree"] == pytest.approx(6.42 / 4.25)
    # the product telescopes: S·f_tree·f_kernels·f_outside = τ_best · T_AR / Σ floors
    floors = weights.floor(gpu) + other.floor(gpu)
    assert c["ceiling"] == pytest.approx(6.42 * 20e-3 / floors)
    assert c["attack"] == "tree"
    # byte floor: bytes at 90 % of bandwidth vs FLOPs at 60 % of peak, whichever is larger
    assert weights.floor(gpu) == pytest.approx(weights.bytes / (0.9 * gpu.bandwidth))
    assert Kernel("mm", 1, bytes=1, flops=1e15).floor(gpu) == pytest.approx(1e15 / (0.6 * gpu.peak_flops))


def test_profile_json_and_override():
    p = profile_from_dict({"gpu": "H200", "bandwidth": 4.5e12, "t_ar": 0.01, "t_step": {"16": 0.011, "32": 0.013},
                           "tau": {"16": 4.0, "32": 4.4}})
    assert p.gpu.bandwidth == 4.5e12 and p.gpu.peak_flops == PRESETS["H200"].peak_flops
    assert speedup(p, 16) == pytest.approx(4.0 / 1.1)
    assert speedup(p, 32) == pytest.approx(4.4 / 1.3)


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def fake_system(clock, delay, seed):
    rng = random.Random(seed)
    base = {i: 0.05 + 0.01 * (i % 7) for i in range(64)}  # seconds per request, request-dependent

    def run(req):
        clock.t += base[req] * (1 + delay) * math.exp(rng.gauss(0, 0.002))  # 0.2 % timing noise
    return run


def test_paired_benchmark_approves_3_percent_and_rejects_identical():
    clock = FakeClock()
    requests = list(range(40))
    same = paired_benchmark(fake_system(clock, 0.0, 1), fake_system(clock, 0.0, 2), requests, repeats=4, clock=clock)
    assert not same.approved and abs(same.gain - 1) < 0.005 and same.ci_low < 1 < same.ci_high
    faster = paired_benchmark(fake_system(clock, 0.03, 3), fake_system(clock, 0.0, 4), requests, repeats=4, clock=clock)
    assert faster.approved, faster.summary()
    assert faster.gain == pytest.approx(1.03, abs=0.005) and faster.noise_a < 0.003
    slower = paired_benchmark(fake_system(clock, 0.0, 5), fake_system(clock, 0.03, 6), requests, repeats=4, clock=clock)
    assert not slower.approved and slower.gain < 1


def test_cli_costmodel_and_paired(tmp_path):
    import json

    from click.testing import CliRunner

    from w12.cli import main

    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"gpu": "H100", "t_ar": 0.02, "t_step": {"8": 0.02361}, "tau": {"8": 4.25},
                                "tau_best": 6.42, "kernels": [{"name": "w", "time": 0.0189, "bytes": 5e10}]}))
    r = CliRunner().invoke(main, ["costmodel", str(prof)])
    assert r.exit_code == 0 and "ceiling" in r.output and "tree" in r.output, r.output
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("\n".join(json.dumps({"i": i}) for i in range(4)) + "\n")
    a = 'python3 -c "import json; print(json.dumps({\\"seconds\\": 1.0}))"'
    b = 'python3 -c "import json; print(json.dumps({\\"seconds\\": 0.5}))"'
    r = CliRunner().invoke(main, ["bench", "--paired", a, b, "--requests", str(reqs), "--repeats", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["gain"] == pytest.approx(2.0) and out["approved"]
