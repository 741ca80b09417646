"""Reference engine on Hugging Face Transformers: greedy speculative generation, batch size 1.

One target pass per step over the whole tree:
  input_ids    = tree tokens (root = last committed token, whose KV is not cached yet)
  position_ids = cached length + depth
  4-D mask     = [1, 1, n, cached + n] float: every cached row visible, and in the new block row i sees
                 node j iff j is i or an ancestor of i (0 = visible, dtype-min = hidden)
Transformers 5.x passes a 4-D mask through as-is (`masking_utils`: "If the mask is already 4D, simply
return as-is") and the DynamicCache appends the n new rows. After acceptance the cache keeps the
root and the accepted path only: `cache.crop()` when that path is the first rows (a chain), otherwise
the accepted rows are gathered in place on every layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .errors import CacheLayoutError
from .trees import Tree
from .verify import accept


@dataclass
class Generation:
    tokens: list[int]                              # new tokens (prompt excluded)
    taus: list[int] = field(default_factory=list)  # tokens committed by each target pass
    seconds: float = 0.0
    draft_seconds: float = 0.0

    @property
    def tau(self) -> float:
        return sum(self.taus) / len(self.taus) if self.taus else float("nan")  # per tree pass


def tree_inputs(tree: Tree, cached: int, dtype: torch.dtype):
    """(input_ids [1, n], position_ids [1, n], attention mask [1, 1, n, cached + n]) for one tree pass."""
    visible = torch.cat([torch.ones(len(tree), cached, dtype=torch.bool), tree.mask()], 1)
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
    return tree.tokens[None], tree.position_ids(cached)[None], mask[None, None]


def keep_rows(cache, start: int, rows: list[int]) -> None:
    """Keep cache rows [0, start) and start + rows (in order); drop the rest of the tree block."""
    n = cache.get_seq_length() - start
    if rows == list(range(len(rows))):
        cache.crop(-(n - len(rows)))           # a chain prefix: the supported crop is enough
        return
    idx = torch.tensor(rows) + start
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise CacheLayoutError(f"cannot gather accepted rows in a {type(layer).__name__}; the reference "
                                   "engine supports full-attention DynamicCache layers only")
        layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., idx, :]], -2)
        layer.values = torch.cat([layer.values[..., :start, :], layer.values[..., idx, :]], -2)


def _eos(model, eos_token_id) -> set[int]:
    eos = model.generation_config.eos_token_id if eos_token_id is None else eos_token_id
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


@torch.no_grad()
def prefill(target, ids: list[int], cache, gen, max_new_tokens: int, eos: set[int], t0: float) -> bool:
    """Prefill as plain decoding does (same shapes, so the first token is bit-for-bit its first token),
    append that token to `gen.tokens` and `ids`; True when generation is already over."""
    first = target(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    gen.tokens.append(int(first.argmax()))
    ids.append(gen.tokens[0])
    if gen.tokens[0] in eos or max_new_tokens <= 1:
        gen.tokens = gen.tokens[:max_new_tokens]
        gen.seconds = time.perf_counter() - t0
        return True
    return False


def clip(new: list[int], emitted: int, max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Accepted tokens cut to the token budget and after the first EOS; (tokens, EOS reached)."""
    new = new[:max_new_tokens - emitted]
    hit = next((i for i, t in enumerate(new) if t in eos), None)
    return (new, False) if hit is None else (new[:hit + 1], True)


def emit(gen, ids: list[int], new: list[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], bool]:
    """Append one pass's accepted tokens (clipped) to the output, its τ and the running ids."""
    new, hit = clip(new, len(gen.tokens), max_new_tokens, eos)
    gen.tokens += new
    gen.taus.append(len(new))
    ids += new
    return new, hit


def speculative_generate(target, drafter, prompt: list[int], build, max_new_tokens: int,
                         eos_token_id=None) -> Generation:
    """Greedy speculative decoding of `target` (any HF causal LM) with `drafter` (.draft(ids) -> Lattice)
    and a tree builder `build(lattice, root) -> Tree`. Output = the target's greedy output."""
    eos, ids = _eos(target, eos_token_id), list(prompt)
    gen, t0 = Generation([]), time.perf_counter()
    cache = DynamicCache(config=target.config)
    # every token after the prefill's comes from a tree pass; taus count tree passes only
    if prefill(target, ids, cache, gen, max_new_tokens, eos, t0):
        return gen
    while len(gen.tokens) < max_new_tokens:
        td = time.perf_counter()
        tree = build(drafter.draft(ids), ids[-1])
        gen.draft_seconds += time.perf_counter() - td
        start = cache.get_seq_length()
        x, pos, mask = tree_inputs(tree, start, target.dtype)
        logits = target(input_ids=x, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits[0]
        path, bonus = accept(tree, logits.argmax(-1))
        keep_rows(cache, start, [0] + path)
        _, hit = emit(gen, ids, [int(tree.tokens[i]) for i in path] + [int(bonus)], max_new_tokens, eos)
        if hit:
            break
    gen.seconds = time.perf_counter() - t0
    return gen


@torch.no_grad()
def greedy_generate(target, prompt: list[int], max_new_tokens: int, eos_token_id=None) -> Generation:
    """Plain greedy decoding with `model.generate(do_sample=False)`: the reference output."""
    t0 = time.perf_counter()
    x = torch.tensor([prompt])
    eos = sorted(_eos(target, eos_token_id)) or None
    out = target.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                          max_new_tokens=max_new_tokens, eos_token_id=eos,
                          pad_token_id=eos[0] if eos else 0)
    tokens = out[0, len(prompt):].tolist()
    return Generation(tokens, [1] * len(tokens), time.perf_counter() - t0)


@torch.no_grad()
def divergence(target, prompt: list[int], ref: list[int], got: list[int]) -> tuple[int, float] | None:
    """Where `got` first leaves the reference `ref`, and the margin there: log p(ref token) − log p(got
    token) under one teacher-forced pass of the target over prompt + ref (fp32 log-softmax). A small
    margin (≲ 0.25 nat in BF16) is a near-tie flipped by rounding, which the paper's definition of an
    exact pass allows; a large one is a bug. None when the outputs are equal."""
    i = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if i is None:
        return None if len(ref) == len(got) else (min(len(ref), len(got)), float("nan"))
    logits = target(input_ids=torch.tensor([list(prompt) + list(ref[:i + 1])])).logits[0, -2].float()
    lp = torch.log_softmax(logits, -1)
    return i, float(lp[ref[i]] - lp[got[i]])
