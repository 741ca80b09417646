"""Token forcing on the real SmolLM2-135M-Instruct (seed paper §3.4), on the CPU.

    python bench/token_forcing.py [--prompts-per-file 10] [--max-new-tokens 32] [--work DIR]

Systems, each on the same chat prompts (the first N of every file in ../shared/data/prompts, 5 files):
  stock     the BF16 model, `generate(do_sample=False)` (DynamicCache, SDPA)
  ar        plain autoregressive decoding without a cache: one full forward per token (other shapes, so
            other rounding): Phase 0 sets δ from where stock first diverges from it
  w12       the W12 conversion loaded by Transformers after `w12.patch_transformers()`, `generate`
  specdec   tree speculative decoding (best-first, 32 nodes, n-gram drafter) with the W12 target
  biased    a planted defect: the BF16 model with +BIAS nats on a fixed FRAC of the vocabulary
Every output is forced through the scorer (the BF16 model, FP32 LM head); the table gives mismatch
counts, rates with 95 % intervals, events with margin ≥ 2δ, and the decision against stock.
Each system's outputs are saved as JSONL in --work (re-runs reuse them), so `w12 check-lossless` can
re-check them.
"""

import argparse
import json
import time
from pathlib import Path

import torch

PROMPT_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts"
FILES = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench"]


class Bias:
    """LogitsProcessor: + bias on a fixed random subset of the vocabulary."""

    def __init__(self, vocab: int, bias: float, frac: float, seed: int = 7):
        self.mask = torch.rand(vocab, generator=torch.Generator().manual_seed(seed)) < frac
        self.bias = bias

    def __call__(self, input_ids, scores):
        return scores + self.bias * self.mask[: scores.shape[-1]].to(scores.dtype)


def eos_ids(model) -> list[int]:
    e = model.generation_config.eos_token_id
    return [e] if isinstance(e, int) else list(e or [])


@torch.no_grad()
def ar_uncached(model, prompt, n, eos):
    ids = list(prompt)
    for _ in range(n):
        t = int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())
        ids.append(t)
        if t in eos:
            break
    return ids[len(prompt):]


def generate(model, prompt, n, eos, processors=None):
    from transformers import LogitsProcessorList

    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         eos_token_id=eos, pad_token_id=eos[0],
                         logits_processor=LogitsProcessorList(processors) if processors else None)
    return out[0, len(prompt):].tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts-per-file", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--bias", type=float, default=1.0)
    ap.add_argument("--frac", type=float, default=0.05)
    ap.add_argument("--work", default="/tmp/w12-token-forcing")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import w12
    from w12.convert.convert import convert
    from w12.convert.fixtures import smollm2_bf16
    from w12.runtime.w12_linear import set_cpu_decode_cache
    from w12.specdec.drafters import NgramDrafter
    from w12.specdec.engine import speculative_generate
    from w12.specdec.prompts import chat_ids, load_prompts
    from w12.specdec.token_forcing import check, decide, phase0_delta
    from w12.specdec.trees import make_builder

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = smollm2_bf16()
    w12dir = work / "smollm2-w12"
    if not (w12dir / "config.json").exists():
        convert(str(src), str(w12dir), overwrite=True)
    w12.patch_transformers()
    set_cpu_decode_cache(1 << 30)
    tok = AutoTokenizer.from_pretrained(src)
    bf16 = AutoModelForCausalLM.from_pretrained(src).eval()
    w12m = AutoModelForCausalLM.from_pretrained(w12dir).eval()
    eos = eos_ids(bf16)
    prompts = [chat_ids(tok, t) for f in FILES for t in load_prompts(PROMPT_DIR / f"{f}.jsonl", args.prompts_per_file)]
    n = args.max_new_tokens
    build = make_builder("best-first", 32)
    systems = {
        "stock": lambda p: generate(bf16, p, n, eos),
        "ar": lambda p: ar_uncached(bf16, p, n, eos),
        "w12": lambda p: generate(w12m, p, n, eos),
        "specdec": lambda p: speculative_generate(w12m, NgramDrafter(8, 16), p, build, n, eos).tokens,
        "biased": lambda p: generate(bf16, p, n, eos, [Bias(bf16.config.vocab_size, args.bias, args.frac)]),
    }
    outputs = {}
    for name, fn in systems.items():
        path = work / f"{name}.jsonl"
        if path.exists() and sum(1 for _ in open(path)) == len(prompts):
            outputs[name] = [json.loads(l)["output_ids"] for l in open(path)]
            continue
        t = time.perf_counter()
        outputs[name] = [fn(p) for p in prompts]
        with open(path, "w") as f:
            for p, o in zip(prompts, outputs[name]):
                f.write(json.dumps({"prompt_ids": p, "output_ids": o}) + "\n")
        print(f"{name}: {len(prompts)} prompts in {time.perf_counter() - t:.0f} s", flush=True)

    delta, margins = phase0_delta(bf16, prompts, outputs["stock"], outputs["ar"])
    stock = check(bf16, prompts, outputs["stock"])
    lines = [f"# Token forcing on SmolLM2-135M-Instruct (CPU) — {time.strftime('%Y-%m-%d')}", "",
             f"- {len(prompts)} chat prompts (first {args.prompts_per_file} of {', '.join(FILES)}), {n} new tokens, "
             f"greedy; scorer: the BF16 model with an FP32 LM head",
             f"- Phase 0: stock vs uncached AR diverge on {len(margins)} prompts; margins "
             f"{', '.join(f'{m:.3f}' for m in sorted(margins))}; δ = {delta}",
             f"- planted defect: +{args.bias} nat on {args.frac:.0%} of the vocabulary",
             f"- command: `python bench/token_forcing.py --prompts-per-file {args.prompts_per_file} "
             f"--max-new-tokens {n}`", "",
             "| system | tokens | mismatches | rate (95 % CI) | events ≥ 2δ | max margin | outputs ≠ stock | decision |",
             "|---|---|---|---|---|---|---|---|"]
    for name in systems:
        rep = stock if name == "stock" else check(bf16, prompts, outputs[name])
        s = rep.summary(delta)
        d = decide(rep, stock, delta)
        differ = sum(a != b for a, b in zip(outputs[name], outputs["stock"]))
        verdict = "(reference)" if name == "stock" else ("**REJECT**: " + "; ".join(d.reasons) if d.reject else "pass")
        lines.append(f"| {name} | {s['tokens']} | {s['mismatches']} | {s['rate']:.2%} ({s['rate_ci95'][0]:.2%}–"
                     f"{s['rate_ci95'][1]:.2%}) | {s['events_ge_2delta']} | {s['max_margin']:.3f} | {differ} | {verdict} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
