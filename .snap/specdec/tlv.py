"""TLV (seed paper §4.3): two-stage verification that rations exact passes. Reference engine, batch 1.

One cycle, from committed tokens ids (the KV of ids[:-1] cached; root = ids[-1]):

  ① draft:     tree1 = build(drafter.draft(ids), root)                      N draft nodes
  Q pass:      argmax of every tree1 node from an APPROXIMATE forward (default: the same model with every
               W12Linear on its 8-bit view, `view8_mode`) that reads the committed cache and leaves it
               as it was: the pass appends its rows and they are cropped off again (`cache.crop(start)`
               slices the original tensors, so the committed rows are bit-identical; tested).
  commit chain C = the Q pass's argmax path through tree1 + its bonus token (nothing accepted yet);
               |C| <= N (cut at N).
  ② draft:     sub = build(drafter.draft(ids + C), C[-1]) with N − |C| draft nodes
  exact pass:  ONE pass of the target with exact weights over root → C → sub (the sub tree hangs under
               C's last node), the same tree pass as engine.speculative_generate; it alone writes the
               cache and accepts the longest matching path + bonus (verify.accept).

Losslessness does not depend on the Q pass: every accepted token is the exact pass's argmax along the
accepted path, exactly as in single-pass verification. A wrong Q pass only shortens the accepted path
(at worst τ = 1: the exact pass's bonus at the root).

Q passes: `view_q(target)` (W12 targets), `model_q(q_model)` (any HF model with the target's cache layout,
e.g. deliberately wrong random weights), or any callable q(tree, cache, start) -> LongTensor [n].

Exact replay (`replay_tlv`): from a recording (lattice after every greedy prefix, as specdec.replay) plus
q_next[m] = the Q pass's argmax after prompt + t[:m]. While the Q pass agrees with the greedy tokens its
walk stays on the greedy path, so only Q's argmaxes along the greedy path matter: C ends at Q's first
disagreement (τ = agreed prefix + 1) or at the first tree1 leaf/missing child (then ② is drafted after a
greedy prefix, which the recording has). `record_q` measures q_next in one extra pass where every row
reads the EXACT cache of its prefix and its own row through the Q weights — the Q pass of a depth-1
node. Deeper Q nodes also read the view-computed rows of their tree ancestors; replay models them by the
depth-1 argmax (an approximation; the live engine measures the real thing — compare τ live vs replay).
Without q_next, `replay_tlv(..., q_agree=p)` models Q as agreeing with the target independently with
probability p per position (seeded).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .engine import Generation, _eos, emit, keep_rows, prefill, tree_inputs
from .errors import TreeError
from .trees import Tree, make_builder
from .verify import accept, walk

STAGES = ("draft1", "q", "draft2", "exact", "append")


@dataclass
class TLVGeneration(Generation):
    chain_lens: list[int] = field(default_factory=list)          # |C| per cycle
    q_agree: list[tuple[int, int]] = field(default_factory=list)  # per cycle: (C positions where Q == exact, |C|)
    audit: list[tuple[int, int]] = field(default_factory=list)    # per cycle, with audit: (tree1 nodes agreeing, nodes)
    stage_seconds: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    @property
    def q_agreement(self) -> float:
        a, n = map(sum, zip(*self.q_agree)) if self.q_agree else (0, 0)
        return a / n if n else float("nan")

    @property
    def audit_agreement(self) -> float:
        a, n = map(sum, zip(*self.audit)) if self.audit else (0, 0)
        return a / n if n else float("nan")


# --- Q passes --------------------------------------------------------------------------------------

def _tree_pass(model, tree: Tree, cache, start: int) -> torch.Tensor:
    x, pos, mask = tree_inputs(tree, start, model.dtype)
    try:
        logits = model(input_ids=x, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits[0]
    finally:
        if cache.get_seq_length() != start:
            cache.crop(-(cache.get_seq_length() - start))   # drop the pass's rows; committed rows untouched
    return logits.argmax(-1)


def model_q(q_model):
    """Q pass = `q_model` (same cache layout as the target) over the tree, reading the committed cache."""
    return lambda tree, cache, start: _tree_pass(q_model, tree, cache, start)


def view_q(target, keep_decoded: bool = True):
    """Q pass = the target with every W12Linear on its 8-bit view (SPEC.md §4)."""
    from w12.runtime.w12_linear import W12Linear, view8_mode

    if not any(isinstance(m, W12Linear) for m in target.modules()):
        raise TreeError("TLV's default Q pass reads the 8-bit view of W12Linear layers, and this target has none; "
                        "pass q_model=... (e.g. a lower-precision copy) or load a W12 checkpoint")
    mode = view8_mode(target, keep_decoded)

    def q(tree, cache, start):
        with mode:
            return _tree_pass(target, tree, cache, start)
    return q


# --- the cycle -------------------------------------------------------------------------------------

def combine(chain_tokens: list[int], root: int, sub: Tree | None) -> Tree:
    """root → chain_tokens[0] → … → chain_tokens[-1] → sub's draft nodes (sub's root = chain_tokens[-1])."""
    c = len(chain_tokens)
    tokens, parents, depths = [root] + list(chain_tokens), list(range(-1, c)), list(range(c + 1))
    scores = [0.0] * (c + 1)
    if sub is not None and len(sub) > 1:
        tokens += sub.tokens[1:].tolist()
        parents += [(c if p == 0 else p + c) for p in sub.parents[1:].tolist()]
        depths += (sub.depths[1:] + c).tolist()
        scores += sub.scores[1:].tolist()
    return Tree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths),
                torch.tensor(scores, dtype=torch.float64))


def commit_chain(tree: Tree, q_next: list[int]) -> list[int]:
    """C: the Q pass's argmax path through the tree + its bonus token."""
    path, bonus = accept(tree, q_next)
    return [int(tree.tokens[i]) for i in path] + [int(bonus)]


@torch.no_grad()
def tlv_generate(target, drafter, prompt: list[int], tree: str, budget: int, max_new_tokens: int, q=None,
                 max_depth: int | None = None, eos_token_id=None, audit: bool = False) -> TLVGeneration:
    """Greedy TLV decoding of `target`; output = the target's greedy output, whatever `q` returns.
    `tree`/`budget`: the builder name and node budget N of both the first tree and the combined tree.
    `q`: a Q pass (see module doc); default `view_q(target)`. `audit`: also run an exact pass over tree1
    (instrumentation only, its rows cropped off) to measure Q top-1 agreement on every tree1 node."""
    q = view_q(target) if q is None else q
    builds = {}

    def build(lat, root, n):
        if n not in builds:
            builds[n] = make_builder(tree, n, max_depth)
        return builds[n](lat, root)

    eos, ids = _eos(target, eos_token_id), list(prompt)
    gen, t0 = TLVGeneration([]), time.perf_counter()
    cache = DynamicCache(config=target.config)
    if prefill(target, ids, cache, gen, max_new_tokens, eos, t0):
        return gen
    st = gen.stage_seconds
    while len(gen.tokens) < max_new_tokens:
        start = cache.get_seq_length()
        t = time.perf_counter()
        tree1 = build(drafter.draft(ids), ids[-1], budget)
        t, st["draft1"] = time.perf_counter(), st["draft1"] + time.perf_counter() - t
        qn = q(tree1, cache, start)
        if cache.get_seq_length() != start:
            raise RuntimeError("the Q pass changed the committed cache length")
        C = commit_chain(tree1, qn.tolist())[:max(budget, 1)]
        t, st["q"] = time.perf_counter(), st["q"] + time.perf_counter() - t
        if audit:                      # instrumentation only: exact argmax of every tree1 node, rows cropped off
            gen.audit.append((int((_tree_pass(target, tree1, cache, start) == qn).sum()), len(tree1)))
            t = time.perf_counter()
        sub = build(drafter.draft(ids + C), C[-1], budget - len(C)) if budget > len(C) else None
        t, st["draft2"] = time.perf_counter(), st["draft2"] + time.perf_counter() - t
        full = combine(C, ids[-1], sub)
        x, pos, mask = tree_inputs(full, start, target.dtype)
        nxt = target(input_ids=x, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits[0].argmax(-1)
        t, st["exact"] = time.perf_counter(), st["exact"] + time.perf_counter() - t
        path, bonus = accept(full, nxt)
        keep_rows(cache, start, [0] + path)
        st["append"] += time.perf_counter() - t
        gen.chain_lens.append(len(C))
        gen.q_agree.append((sum(int(nxt[i]) == C[i] for i in range(len(C))), len(C)))
        _, hit = emit(gen, ids, [int(full.tokens[i]) for i in path] + [int(bonus)], max_new_tokens, eos)
        if hit:
            break
    gen.seconds = time.perf_counter() - t0
    gen.draft_seconds = st["draft1"] + st["draft2"]
    return gen


# --- exact replay ----------------------------------------------------------------------------------

@torch.no_grad()
def record_q(target, prompt: list[int], tokens: list[int], q_model=None) -> list[int]:
    """q_next[m] for m in [0, T): the Q pass's argmax after prompt + tokens[:m], each row reading the exact
    cache of its prefix (one exact causal pass) and itself through the Q weights (one masked pass).
    q_model None: the target's 8-bit view. q_next[0] is the prefill's (exact) token in the engines."""
    from w12.runtime.w12_linear import view8_mode

    ids = list(prompt) + list(tokens[:-1])
    L, Lp = len(ids), len(prompt)
    cache = DynamicCache(config=target.config)
    target(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
    qm = target if q_model is None else q_model
    ar = torch.arange(L)
    visible = torch.cat([ar[None, :] < ar[:, None], torch.eye(L, dtype=torch.bool)], 1)
    mask = torch.zeros(visible.shape, dtype=qm.dtype).masked_fill_(~visible, torch.finfo(qm.dtype).min)
    ctx = view8_mode(target) if q_model is None else _null()
    with ctx:
        logits = qm(input_ids=torch.tensor([ids]), position_ids=ar[None], attention_mask=mask[None, None],
                    cache=cache, use_cache=True).logits[0]
    return logits[Lp - 1:].argmax(-1).tolist()


class _null:
    def __enter__(self):
        return 0

    def __exit__(self, *exc):
        return None


def replay_tlv(rec, tree: str, budget: int, q_next: list[int] | None = None, q_agree: float | None = None,
               seed: int = 0, max_depth: int | None = None) -> list[int]:
    """τ (tokens per exact pass) of each TLV cycle over a recording (specdec.replay.Record). Q's argmax
    after prompt + t[:m] is q_next[m] (recorded), or, with q_agree=p, t[m] with probability p and a
    wrong token otherwise. See the module doc for what is exact and what is modelled."""
    if q_next is None and q_agree is None:
        raise TreeError("replay_tlv needs the recorded Q argmaxes (q_next) or a Q agreement model (q_agree)")
    rng = random.Random(seed)
    t, T = rec.tokens, len(rec.tokens)
    builds = {}

    def build(lat, root, n):
        if n not in builds:
            builds[n] = make_builder(tree, n, max_depth)
        return builds[n](lat, root)

    def q_ok(m):
        return q_next[m] == t[m] if q_next is not None else rng.random() < q_agree

    taus, j = [], 1
    while j < T:
        tree1 = build(rec.lattices[j], rec.root(j), budget)
        children = tree1.children()
        node, c, tau = 0, 0, None
        while True:                   # walk Q's argmax path while it agrees with the target
            if j + c >= T:
                tau = c
                break
            if not q_ok(j + c):       # Q wrong here: C's token at c is wrong, exact accepts c, bonus t[j+c]
                tau = c + 1
                break
            child = children[node].get(t[j + c])
            c += 1
            if child is None or c >= budget:   # t[j+c-1] is C's bonus (or C is cut at N): C = t[j:j+c]
                break
            node = child
        if tau is None:
            if c < budget and j + c < T:
                sub = build(rec.lattices[j + c], t[j + c - 1], budget - c)
                tau = c + walk(sub, t[j + c:])
            else:
                tau = c + (1 if j + c < T else 0)
        tau = max(1, min(tau, T - j))
        taus.append(tau)
        j += tau
    return taus


# --- prompt sets, recordings, CLI helpers ----------------------------------------------------------

def run_prompts_tlv(target, drafter, prompts: list[list[int]], tree: str, budget: int, max_new_tokens: int,
                    check: bool = False, keep_record: bool = False, eos_token_id=None, progress=None, q=None):
    """TLV generation of every prompt (the TLV side of specdec.run.run_prompts). Records, when kept, are
    (Record, q_next) pairs: lattices after every greedy prefix + the Q argmax per prefix (`record_q`)."""
    from .run import prompt_report
    from .replay import record

    results, records = [], [] if keep_record else None
    for i, prompt in enumerate(prompts):
        gen = tlv_generate(target, drafter, prompt, tree, budget, max_new_tokens, q=q, eos_token_id=eos_token_id)
        a, n = map(sum, zip(*gen.q_agree)) if gen.q_agree else (0, 0)
        r = prompt_report(i, prompt, gen, target, check, max_new_tokens, eos_token_id)
        r.update(q_agree=[a, n], mean_chain=round(sum(gen.chain_lens) / max(1, len(gen.chain_lens)), 3),
                 stage_seconds={k: round(v, 4) for k, v in gen.stage_seconds.items()})
        if keep_record:
            records.append((record(drafter, prompt, gen.tokens), record_q(target, prompt, gen.tokens)))
        results.append(r)
        if progress:
            progress(r)
    return results, records


def save_tlv_records(path, records, meta: dict | None = None) -> None:
    """A normal specdec recording (load_records reads it) with each record's "q_next" added."""
    import gzip
    import json

    from .replay import FORMAT, VERSION

    doc = {"format": FORMAT, "version": VERSION, "meta": {**(meta or {}), "tlv": True},
           "records": [{"prompt": r.prompt, "tokens": r.tokens, "lattices": [l.to_dict() for l in r.lattices],
                        "q_next": list(map(int, q))} for r, q in records]}
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(doc, f, separators=(",", ":"))


def load_q_next(path) -> list[list[int]] | None:
    """The recorded Q argmaxes of a `generate --tlv --record` file, or None when it has none."""
    import gzip
    import json

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        recs = json.load(f)["records"]
    return [r["q_next"] for r in recs] if all("q_next" in r for r in recs) else None


def tlv_tau_table(path, records, budgets, builders, max_depth=None, q_agree=None) -> dict:
    """{"tlv-<builder>": {budget: tokens per exact pass}} from recorded q_next (or the q_agree model)."""
    from .replay import mean_tau

    q = None if q_agree is not None else load_q_next(path)
    if q is None and q_agree is None:
        raise TreeError(f"{path} has no recorded Q argmaxes (record with `generate --tlv --record`); "
                        "or pass --q-agree P to model the Q pass")
    return {f"tlv-{name}": {n: mean_tau([replay_tlv(r, name, n, q_next=None if q is None else q[i], q_agree=q_agree,
                                                    seed=i, max_depth=max_depth) for i, r in enumerate(records)])
                            for n in budgets} for name in builders}
