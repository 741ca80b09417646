"""Loading models and drafters, and running a prompt set: the library side of `w12 specdec generate`
and of bench/specdec_replay.py."""

from __future__ import annotations

from pathlib import Path

import torch

from .drafters import ModelDrafter, NgramDrafter, truncated_copy
from .engine import divergence, greedy_generate, speculative_generate
from .errors import DrafterError
from .replay import record

DTYPES = {"auto": "auto", "bfloat16": torch.bfloat16, "float32": torch.float32}


def load_model(path, dtype: str = "auto"):
    """A Hugging Face causal LM in eval mode (a W12 checkpoint needs `w12.patch_transformers()` first)."""
    from transformers import AutoModelForCausalLM

    if not Path(path).is_dir():
        raise DrafterError(f"no model folder at {path}")
    return AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).eval()


def make_drafter(spec: str, target, layers: int | None = None, positions: int = 8, topk: int = 16,
                 dtype: str = "auto"):
    """'ngram' → prompt lookup; 'self' → a copy of the target; else a model folder. `layers` keeps the
    first N decoder layers (+ final norm and LM head) of the model."""
    if spec == "ngram":
        return NgramDrafter(positions, topk)
    model = target if spec == "self" else load_model(spec, dtype)
    vt, vd = target.get_output_embeddings().weight.shape[0], model.get_output_embeddings().weight.shape[0]
    if vt != vd:
        raise DrafterError(f"drafter vocabulary has {vd} rows, the target's {vt}: the drafter must share the "
                           "target's tokenizer")
    if layers:
        model = truncated_copy(model, layers)
    elif spec == "self":
        raise DrafterError("--drafter self needs --drafter-layers N (a truncated copy of the target)")
    if dtype != "auto":
        model = model.to(DTYPES[dtype])
    return ModelDrafter(model, positions, topk)


def prompt_report(i: int, prompt: list[int], gen, target, check: bool, max_new_tokens: int, eos_token_id=None):
    """One prompt's figures; with `check`, plain greedy decoding too and the first divergence (index, margin)."""
    r = {"prompt": i, "prompt_tokens": len(prompt), "new_tokens": len(gen.tokens), "passes": len(gen.taus),
         "tau": round(gen.tau, 4), "seconds": round(gen.seconds, 3),
         "tokens_per_s": round(len(gen.tokens) / gen.seconds, 2), "draft_seconds": round(gen.draft_seconds, 3)}
    if check:
        ref = greedy_generate(target, prompt, max_new_tokens, eos_token_id)
        r.update(greedy_seconds=round(ref.seconds, 3), greedy_tokens_per_s=round(len(ref.tokens) / ref.seconds, 2),
                 identical=gen.tokens == ref.tokens, divergence=divergence(target, prompt, ref.tokens, gen.tokens))
    return r


def run_prompts(target, drafter, prompts: list[list[int]], build, max_new_tokens: int, check: bool = False,
                keep_record: bool = False, eos_token_id=None, progress=None):
    """Speculative generation of every prompt; with `check`, also plain greedy decoding and the first
    divergence (index, margin in nats) if any. Returns (per-prompt dicts, records or None)."""
    results, records = [], [] if keep_record else None
    for i, prompt in enumerate(prompts):
        gen = speculative_generate(target, drafter, prompt, build, max_new_tokens, eos_token_id)
        r = prompt_report(i, prompt, gen, target, check, max_new_tokens, eos_token_id)
        if keep_record:
            records.append(record(drafter, prompt, gen.tokens))
        results.append(r)
        if progress:
            progress(r)
    return results, records


def summarize(results: list[dict]) -> dict:
    tokens = sum(r["new_tokens"] for r in results)
    out = {"prompts": len(results), "new_tokens": tokens,
           "tau": round(sum(r["tau"] * r["passes"] for r in results) / max(1, sum(r["passes"] for r in results)), 4),
           "tokens_per_s": round(tokens / sum(r["seconds"] for r in results), 2)}
    if results and "identical" in results[0]:
        out["greedy_tokens_per_s"] = round(tokens / sum(r["greedy_seconds"] for r in results), 2)
        out["identical"] = sum(r["identical"] for r in results)
        out["speedup"] = round(out["tokens_per_s"] / out["greedy_tokens_per_s"], 3)
    return out
