"""Token forcing (seed paper §3.4): does a system emit the target's argmax?

Each output token of a system is teacher-forced through a scorer — the reference BF16 target with an
FP32 LM head — and counted as a mismatch when it differs from the scorer's argmax. Its margin is
log p(argmax) − log p(token) ≥ 0 under the scorer. Exact systems still mismatch at near-ties (rounding
of their own kernels), so the decision compares a system with stock:

    Phase 0   δ = the largest margin where stock first diverges from plain autoregressive decoding,
              rounded up to a multiple of 1/8 (1/8 when they never diverge)
    reject    mismatch rate > stock's + 0.5 points,  or  rate of events (margin ≥ 2δ) > stock's
"""

import math
from dataclasses import dataclass, field

import torch

from .errors import SpecdecError


class ForcingInputError(SpecdecError):
    """Outputs to force are empty or do not match the prompts they claim to continue."""


@dataclass
class Forced:
    """Per-token scorer verdicts for one system output."""
    argmax: list[int]
    margins: list[float]  # log p(argmax) − log p(token), 0 where they agree


@torch.no_grad()
def force(scorer, prompt: list[int], output: list[int]) -> Forced:
    """Teacher-force `output` after `prompt` through `scorer` with its LM head in FP32."""
    if not output:
        return Forced([], [])
    ids = torch.tensor([prompt + output])
    hidden = scorer.base_model(input_ids=ids).last_hidden_state[0, len(prompt) - 1:len(prompt) + len(output) - 1]
    head = scorer.get_output_embeddings()
    logits = hidden.float() @ head.weight.float().T
    if getattr(head, "bias", None) is not None:
        logits = logits + head.bias.float()
    logp = torch.log_softmax(logits, dim=-1)
    best = logp.argmax(dim=-1)
    tok = torch.tensor(output)
    margins = (logp.gather(1, best[:, None]) - logp.gather(1, tok[:, None]))[:, 0]
    margins = torch.where(best == tok, torch.zeros_like(margins), margins)
    return Forced(best.tolist(), margins.tolist())


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson interval of a rate k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


@dataclass
class ForcingReport:
    tokens: int = 0
    margins: list[float] = field(default_factory=list)  # one per mismatch

    @property
    def mismatches(self) -> int:
        return len(self.margins)

    @property
    def rate(self) -> float:
        return self.mismatches / self.tokens if self.tokens else 0.0

    def events(self, threshold: float) -> int:
        return sum(m >= threshold for m in self.margins)

    def summary(self, delta: float) -> dict:
        ev = self.events(2 * delta)
        return {"tokens": self.tokens, "mismatches": self.mismatches, "rate": self.rate,
                "rate_ci95": wilson(self.mismatches, self.tokens), "events_ge_2delta": ev,
                "event_rate": ev / self.tokens if self.tokens else 0.0,
                "max_margin": max(self.margins, default=0.0)}


def check(scorer, prompts: list[list[int]], outputs: list[list[int]]) -> ForcingReport:
    """Force every output through the scorer; collect mismatch margins."""
    if len(prompts) != len(outputs):
        raise ForcingInputError(f"{len(prompts)} prompts but {len(outputs)} outputs")
    report = ForcingReport()
    for p, o in zip(prompts, outputs):
        f = force(scorer, p, o)
        report.tokens += len(o)
        report.margins += [m for a, t, m in zip(f.argmax, o, f.margins) if a != t]
    return report


def first_divergence_margin(scorer, prompt: list[int], a: list[int], b: list[int]) -> float | None:
    """|log p(a_j) − log p(b_j)| under the scorer at the first j where a and b differ (None if never)."""
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if j is None:
        return None
    with torch.no_grad():
        ids = torch.tensor([prompt + a[:j]])
        h = scorer.base_model(input_ids=ids).last_hidden_state[0, -1].float()
        logp = torch.log_softmax(h @ scorer.get_output_embeddings().weight.float().T, dim=-1)
    return abs(float(logp[a[j]] - logp[b[j]]))


def phase0_delta(scorer, prompts, stock_outputs, ar_outputs) -> tuple[float, list[float]]:
    """δ: the largest first-divergence margin between stock and AR, rounded up to a multiple of 1/8."""
    margins = [m for p, s, a in zip(prompts, stock_outputs, ar_outputs)
               if (m := first_divergence_margin(scorer, p, s, a)) is not None]
    top = max(margins, default=0.0)
    return max(1 / 8, math.ceil(top * 8) / 8), margins


@dataclass
class Decision:
    reject: bool
    reasons: list[str]


def decide(system: ForcingReport, stock: ForcingReport, delta: float) -> Decision:
    reasons = []
    if system.rate > stock.rate + 0.005:
        reasons.append(f"mismatch rate {system.rate:.2%} exceeds stock's {stock.rate:.2%} by more than 0.5 points")
    s_ev, k_ev = system.events(2 * delta) / max(system.tokens, 1), stock.events(2 * delta) / max(stock.tokens, 1)
    if s_ev > k_ev:
        reasons.append(f"events with margin ≥ 2δ = {2 * delta:.3f}: {s_ev:.3%} of tokens, stock {k_ev:.3%}")
    return Decision(bool(reasons), reasons)
