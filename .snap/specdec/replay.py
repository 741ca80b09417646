"""Exact replay: τ of any tree builder from recorded lattices and the target's greedy continuation,
with no model in the loop.

A `Record` holds, for one prompt, the target's greedy tokens t[0..T) and, for every j, the lattice the
drafter returns after prompt + t[:j]. Replaying a builder is then exactly what the engine does (t[0]
comes from the prefill, as in the engine):

    j = 1
    repeat: tree = build(lattice[j], root = t[j-1]);  τ = walk(tree, t[j:]);  j += τ

The drafter is deterministic given the prefix and the target's continuation is known, so no model is
needed. τ of a run = Σ τ / passes (bonus token included).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import RecordError
from .lattice import Lattice
from .trees import acceptance_rates, make_builder
from .verify import walk

FORMAT, VERSION = "w12-specdec-record", 1


@dataclass
class Record:
    prompt: list[int]
    tokens: list[int]                      # the target's greedy continuation t[0..T)
    lattices: list[Lattice] = field(default_factory=list)  # lattices[j]: drafted after prompt + t[:j]

    def root(self, j: int) -> int:
        return self.tokens[j - 1] if j else self.prompt[-1]

    def steps(self):
        """(lattice, continuation) for every position: the input of Sequoia's rate estimate."""
        return [(lat, self.tokens[j:j + lat.positions + 1]) for j, lat in enumerate(self.lattices) if j]


def replay(rec: Record, build) -> list[int]:
    """τ of each target pass when `build` (lattice, root) -> Tree drives generation over `rec`."""
    taus, j = [], 1
    while j < len(rec.tokens):
        tau = walk(build(rec.lattices[j], rec.root(j)), rec.tokens[j:])
        taus.append(tau)
        j += tau
    return taus


def oracle(rec: Record) -> list[int]:
    """The oracle of the paper: keep accepting while the target's token is in the drafter's top-k at
    that position (any branch, as if the tree held every lattice path)."""
    taus, j = [], 1
    while j < len(rec.tokens):
        lat, n = rec.lattices[j], 0
        ids = lat.lists()[0]
        while n < lat.positions and j + n < len(rec.tokens) and rec.tokens[j + n] in ids[n]:
            n += 1
        tau = min(n + 1, len(rec.tokens) - j)
        taus.append(tau)
        j += tau
    return taus


def mean_tau(runs: list[list[int]]) -> float:
    """Tokens per target pass over several runs (Σ tokens / Σ passes)."""
    passes = sum(len(t) for t in runs)
    return sum(sum(t) for t in runs) / passes if passes else float("nan")


def tau_table(records: list[Record], budgets=(16, 32, 64),
              builders=("chain", "best-first", "eagle2", "sequoia"), max_depth: int | None = None) -> dict:
    """{builder: {budget: τ}} plus {"oracle": τ}. Sequoia's rates are estimated from the same records
    (in-sample, which favours Sequoia)."""
    depth = max((lat.positions for r in records for lat in r.lattices), default=0)
    k = max((lat.topk for r in records for lat in r.lattices), default=0)
    rates = acceptance_rates([s for r in records for s in r.steps()], depth, k) if depth and k else None
    table = {}
    for name in builders:
        opts = {"rates": rates} if name == "sequoia" else {}
        table[name] = {n: mean_tau([replay(r, make_builder(name, n, max_depth, **opts)) for r in records])
                       for n in budgets}
    table["oracle"] = mean_tau([oracle(r) for r in records])
    return table


def record(drafter, prompt: list[int], tokens: list[int]) -> Record:
    """Draft after every prefix prompt + tokens[:j]. A drafter may offer `record_dense` (all positions
    in a few batched passes); otherwise `draft` is called T times."""
    if hasattr(drafter, "record_dense"):
        lattices = drafter.record_dense(prompt, tokens)
    else:
        lattices = [drafter.draft(list(prompt) + list(tokens[:j])) for j in range(len(tokens))]
    return Record(list(prompt), list(tokens), lattices)


# --- file form: JSON (gzip when the name ends in .gz) ------------------------------------------

def save_records(path, records: list[Record], meta: dict | None = None) -> None:
    doc = {"format": FORMAT, "version": VERSION, "meta": meta or {},
           "records": [{"prompt": r.prompt, "tokens": r.tokens, "lattices": [l.to_dict() for l in r.lattices]}
                       for r in records]}
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(doc, f, separators=(",", ":"))


def load_records(path) -> tuple[list[Record], dict]:
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"no recording at {path}; make one with `w12 specdec generate ... --record {path}`")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecordError(f"{path} is not a JSON recording ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise RecordError(f"{path}: expected format {FORMAT!r} version {VERSION}, found "
                          f"{doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r} "
                          f"version {doc.get('version') if isinstance(doc, dict) else None}")
    try:
        records = [Record(r["prompt"], r["tokens"], [Lattice.from_dict(l) for l in r["lattices"]])
                   for r in doc["records"]]
    except (KeyError, TypeError) as e:
        raise RecordError(f"{path}: a record lacks prompt/tokens/lattices ({e})") from e
    for i, r in enumerate(records):
        if len(r.lattices) != len(r.tokens) or not r.prompt:
            raise RecordError(f"{path}: record {i} has {len(r.tokens)} tokens but {len(r.lattices)} lattices")
    return records, doc.get("meta", {})
