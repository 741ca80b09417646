"""bench/hf_decode.py's figures over several process pairs: rounds pooled, medians recomputed, each pair kept."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import hf_decode  # noqa: E402


def entry(rates, plain, gemm_total=None):
    res = {"decode_tok_s": hf_decode._median(rates), "round_tok_s": rates,
           "decode_tok_s_plain": hf_decode._median(plain), "round_tok_s_plain": plain,
           "plain_generate_same_tokens": True, "round_gpu": [None] * len(rates), "tokens": [1, 2]}
    if gemm_total is not None:
        res["gemm_us_per_token"] = {"total": gemm_total}
        res["other_us_per_token"] = 1e6 / res["decode_tok_s"] - gemm_total
    return res


def test_pool_takes_every_round_and_keeps_each_pair():
    a = entry([100.0, 110.0, 120.0], [90.0, 95.0, 100.0], gemm_total=4000.0)
    b = entry([130.0, 140.0], [80.0, float("nan")], gemm_total=4100.0)
    p = hf_decode.pool([a, b])
    assert p["round_tok_s"] == [100.0, 110.0, 120.0, 130.0, 140.0]
    assert p["decode_tok_s"] == 120.0  # median of all five rounds, not of the two pairs' medians
    assert p["decode_tok_s_plain"] == 92.5  # the NaN round (stopped at EOS) is left out: median of 90, 95, 100, 80
    assert [q["decode_tok_s"] for q in p["per_pair"]] == [110.0, 135.0]
    assert p["other_us_per_token"] == pytest.approx(1e6 / 120.0 - 4000.0)
    assert hf_decode.pool([a]) == {**a, "round_gpu": a["round_gpu"]}  # one pair: its own result, no per_pair


def test_pair_figures_and_table():
    done = {"bf16": entry([100.0, 102.0, 98.0], [100.0, 100.0, 100.0]),
            "w12": entry([125.0, 130.0, 120.0], [130.0, 130.0, 130.0])}
    f = hf_decode.pair_figures(done)
    assert f["speedup"] == pytest.approx(1.25)
    assert f["speedup_plain_generate"] == pytest.approx(1.30)
    assert f["median_round_ratio"] == pytest.approx(sorted([125 / 100, 130 / 102, 120 / 98])[1])
    result = {"pairs": [f, f], "bf16": hf_decode.pool([done["bf16"]] * 2), "w12": hf_decode.pool([done["w12"]] * 2),
              "speedup_w12_over_bf16": 1.25, "median_round_ratio": 1.25, "speedup_w12_over_bf16_plain_generate": 1.3}
    rows = hf_decode.summary_table(result).splitlines()
    assert len(rows) == 2 + 2 + 1 and rows[-1].startswith("| all rounds | 100.0 | 125.0 | 1.250 |")
