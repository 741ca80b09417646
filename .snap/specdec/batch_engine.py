"""Batched reference engine on Hugging Face Transformers: several requests per target pass, each with its
own tree, positions and cache rows; requests join (prompt rows merged into a verification step) and
finish independently. Greedy and lossless per request.

Layout (one padded batch, one pass per step). Row b of the batch is request b:

    input_ids    [B, Nmax]        its tree tokens (root = last committed token) or, on admission, its
                                  prompt as a causal chain; right-padded with token 0
    position_ids [B, Nmax]        C_b + depth (C_b = its cached length); pads 0
    4-D mask     [B, 1, Nmax, Lmax + Nmax] float (0 visible, dtype-min hidden): cache slots [0, C_b)
                                  visible, slots [C_b, Lmax) are padding and hidden; in the new block,
                                  node i sees node j iff j is i or an ancestor; a pad query sees itself only
    cache        DynamicCache rebuilt each step from the ragged store K, V [B, H, Lmax, D] (right-padded)

After the pass, each row keeps its cached slots + the root and its accepted path (a prompt keeps all its
rows); rows are gathered into a fresh right-padded store (one `gather` per layer), finished requests
are dropped from the batch dimension, and admitted prompts are appended as rows with C_b = 0.

Why a padded batch and not one packed row with a block-diagonal mask: Transformers 5.x takes a 4-D
float mask as-is with per-row position ids for Llama/Qwen3, and a padded batch keeps each request's
attention to its own keys (the packed row makes every query attend over all requests' caches, cost
Σ nodes × Σ cache). A DynamicCache has one length for the whole batch, so the ragged lengths live in
the mask; the padding slots carry finite stale values that the mask weights exactly 0 in float32.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .batching import BatchStats, DraftBlock, admit_always, shared_budget
from .engine import Generation, _eos, clip
from .errors import CacheLayoutError
from .lattice import Lattice
from .trees import Tree
from .verify import accept


@dataclass
class Request:
    rid: int
    prompt: list[int]
    drafter: object
    max_new_tokens: int
    arrive: int = 0                      # first step at which it may be admitted
    gen: Generation = field(default_factory=lambda: Generation([]))
    ids: list[int] = field(default_factory=list)
    cached: int = 0
    waited: int = 0
    block: dict | None = None
    done: bool = False
    t0: float = 0.0


def _chain(tokens: list[int]) -> Tree:
    n = len(tokens)
    return Tree(torch.tensor(tokens), torch.arange(-1, n - 1), torch.arange(n), torch.zeros(n, dtype=torch.float64))


class BatchEngine:
    """plan(lattices, roots, max_depths) -> trees: e.g. `partial(shared_budget, total=N)`; block: a
    DraftBlock (sets each drafter's `positions` when it has one and caps tree depth) or None; admit:
    (step_rows, prompt_rows, waited, running) -> bool."""

    def __init__(self, target, plan=None, block: DraftBlock | None = None, admit=admit_always,
                 eos_token_id=None, max_batch: int = 64):
        self.target, self.plan, self.block, self.admit = target, plan, block, admit
        self.plan = plan or (lambda lats, roots, max_depths: shared_budget(lats, roots, 16 * len(lats), max_depths))
        self.eos = _eos(target, eos_token_id)
        self.max_batch = max_batch
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: dict[int, Generation] = {}
        self.K: list[torch.Tensor] | None = None     # per layer [B, H, Lmax, D]
        self.V: list[torch.Tensor] | None = None
        self.stats = BatchStats()
        self.now = 0
        self._next = 0

    def submit(self, prompt: list[int], drafter, max_new_tokens: int, arrive: int = 0) -> int:
        rid, self._next = self._next, self._next + 1
        self.waiting.append(Request(rid, list(prompt), drafter, max_new_tokens, arrive,
                                    block=self.block.init() if self.block else None))
        return rid

    def run(self) -> dict[int, Generation]:
        while self.waiting or self.running:
            self.step()
        return self.finished

    # --- one step --------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        # 1. trees for the running requests (the verification rows)
        lats, depths = [], []
        for r in self.running:
            td = time.perf_counter()
            P = None
            if self.block is not None:
                P = self.block.choose(r.block)
                if hasattr(r.drafter, "positions"):
                    r.drafter.positions = P
            lat = r.drafter.draft(r.ids)
            r.gen.draft_seconds += time.perf_counter() - td
            lats.append(lat)
            depths.append(P)
        trees = self.plan(lats, [r.ids[-1] for r in self.running], max_depths=depths) if self.running else []
        step_rows = sum(len(t) for t in trees)
        # 2. prompt admission (arrived, in order; each admitted prompt adds its rows)
        admitted = []
        for r in [w for w in self.waiting if w.arrive <= self.now]:
            running = len(self.running) + len(admitted)
            if running >= self.max_batch:
                break
            if self.admit(step_rows, len(r.prompt), r.waited, running):
                admitted.append(r)
                step_rows += len(r.prompt)
            else:
                r.waited += 1
        for r in admitted:
            self.waiting.remove(r)
            r.t0 = time.perf_counter()
        if not self.running and not admitted:
            self.now += 1
            return
        rows = [(r, t) for r, t in zip(self.running, trees)] + [(r, _chain(r.prompt)) for r in admitted]
        self.stats.note(step_rows, sum(len(r.prompt) for r in admitted), len(rows))
        # 3. one target pass over the padded batch
        self._append_rows(len(admitted))
        logits = self._forward([r.cached for r, _ in rows], [t for _, t in rows])
        # 4. accept per request, keep its rows
        keep, leave = [], []
        for b, (r, tree) in enumerate(rows):
            nxt = logits[b, :len(tree)].argmax(-1)
            if r in admitted:                        # the prefill: all prompt rows stay, first token
                kept, new = list(range(len(tree))), [int(nxt[-1])]
                r.ids = list(r.prompt)
            else:
                path, bonus = accept(tree, nxt)
                kept, new = [0] + path, [int(tree.tokens[i]) for i in path] + [int(bonus)]
                if self.block is not None:
                    self.block.update(r.block, len(path), lats[b])
            new, hit = clip(new, len(r.gen.tokens), r.max_new_tokens, self.eos)
            r.gen.tokens += new
            if r not in admitted:
                r.gen.taus.append(len(new))
            r.ids += new
            keep.append(kept)
            r.done = bool(hit) or len(r.gen.tokens) >= r.max_new_tokens
        self._compact([r.cached for r, _ in rows], keep, [not r.done for r, _ in rows])
        for b, (r, _) in enumerate(rows):
            r.cached += len(keep[b])
            if r.done:
                r.gen.seconds = time.perf_counter() - r.t0
                self.finished[r.rid] = r.gen
        self.running = [r for r, _ in rows if not r.done]
        self.now += 1

    # --- cache store -------------------------------------------------------------------------------
    def _append_rows(self, n: int) -> None:
        """Add n empty rows (C = 0) at the end of the batch."""
        if n == 0 or self.K is None:
            return
        pad = lambda t: torch.cat([t, t.new_zeros(n, *t.shape[1:])], 0)
        self.K, self.V = [pad(k) for k in self.K], [pad(v) for v in self.V]

    def _forward(self, cached: list[int], trees: list[Tree]) -> torch.Tensor:
        B, N = len(trees), max(len(t) for t in trees)
        L = 0 if self.K is None else self.K[0].shape[-2]
        dtype = self.target.dtype
        x = torch.zeros(B, N, dtype=torch.long)
        pos = torch.zeros(B, N, dtype=torch.long)
        visible = torch.zeros(B, N, L + N, dtype=torch.bool)
        for b, (c, t) in enumerate(zip(cached, trees)):
            n = len(t)
            x[b, :n], pos[b, :n] = t.tokens, t.position_ids(c)
            visible[b, :n, :c] = True
            visible[b, :n, L:L + n] = t.mask()
            visible[b, torch.arange(n, N), L + torch.arange(n, N)] = True       # pad queries: themselves
        mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
        cache = DynamicCache(config=self.target.config)
        if L:
            for i, (k, v) in enumerate(zip(self.K, self.V)):
                cache.update(k, v, i)
        out = self.target(input_ids=x, position_ids=pos, attention_mask=mask[:, None], cache=cache,
                          use_cache=True).logits
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise CacheLayoutError(f"the batched engine supports full-attention DynamicCache layers only, "
                                       f"found {type(layer).__name__}")
        self._cache, self._L = cache, L
        return out

    def _compact(self, cached: list[int], keep: list[list[int]], stay: list[bool]) -> None:
        """Each staying row keeps its cached slots [0, C_b) and slots L + keep[b]; right-padded again."""
        rows = [b for b, s in enumerate(stay) if s]
        if not rows:
            self.K = self.V = None
            return
        L = self._L
        idx = [list(range(cached[b])) + [L + i for i in keep[b]] for b in rows]
        Lnew = max(len(i) for i in idx)
        idx = torch.tensor([i + [0] * (Lnew - len(i)) for i in idx])            # pads point at slot 0
        sel = torch.tensor(rows)
        K, V = [], []
        for layer in self._cache.layers:
            k, v = layer.keys[sel], layer.values[sel]
            g = idx[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[-1])
            K.append(torch.gather(k, 2, g))
            V.append(torch.gather(v, 2, g))
        self.K, self.V, self._cache = K, V, None


def batch_generate(target, jobs, plan=None, block=None, admit=admit_always, eos_token_id=None):
    """jobs: [(prompt, drafter, max_new_tokens, arrive_step)] -> [Generation] in job order."""
    eng = BatchEngine(target, plan, block, admit, eos_token_id)
    ids = [eng.submit(p, d, n, a) for p, d, n, a in jobs]
    out = eng.run()
    return [out[i] for i in ids], eng.stats
