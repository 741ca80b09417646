"""Lossless speculative decoding on any Hugging Face causal LM (BF16 or W12).

lattice.py (drafter output), trees.py (chain, best-first, EAGLE-2, Sequoia), verify.py (greedy
acceptance), replay.py (exact replay, no model), drafters.py, engine.py (reference engine, batch 1),
tlv.py (two-stage verification with the 8-bit view), batching.py + batch_engine.py (shared node budget,
draft blocks, prompt admission), gdn_tree.py (hybrid GDN targets by path recompute), token_forcing.py,
cost_model.py, paired_bench.py, prompts.py + run.py (prompt files, CLI/bench plumbing)."""
