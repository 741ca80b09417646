"""`w12 specdec generate / replay` on a tiny random Llama with a byte-level tokenizer (built offline)."""

import json

import pytest
import torch
from click.testing import CliRunner
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import w12
from w12.cli_specdec import _patch_if_w12, specdec

torch.set_num_threads(1)


def save_tiny(path, seed, vocab=260, layers=2):
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=512, initializer_range=0.1,
                      eos_token_id=259, bos_token_id=258)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   chat_template="{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}assistant:")
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    prompts = root / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [t, "second turn"]}) for t in
                                 ["abc abc abc abc", "Write a function that adds two numbers.", "What is 2+2? 2+2=", "x"]))
    return save_tiny(root / "target", 0), save_tiny(root / "drafter", 1, layers=1), save_tiny(root / "other", 2, vocab=300), prompts


def invoke(*args):
    return CliRunner().invoke(specdec, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("drafter,extra", [("ngram", []), ("DRAFTER", ["--tree", "eagle2", "--budget", "8"]),
                                           ("self", ["--drafter-layers", "1", "--tree", "sequoia"])])
def test_generate_check_is_identical(tiny_models, drafter, extra):
    target, drafter_dir, _, prompts = tiny_models
    r = invoke("generate", "--target", target, "--drafter", drafter_dir if drafter == "DRAFTER" else drafter,
               "--prompts", prompts, "--max-new-tokens", 12, "--positions", 4, "--topk", 4, "--check", "--json", *extra)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["summary"]["identical"] == doc["summary"]["prompts"] == 4
    assert all(p["identical"] and p["tau"] >= 1 for p in doc["prompts"])


def test_record_then_replay(tiny_models, tmp_path):
    target, _, _, prompts = tiny_models
    rec = tmp_path / "rec.json.gz"
    r = invoke("generate", "--target", target, "--drafter", "ngram", "--prompts", prompts, "--max-new-tokens", 16,
               "--record", rec, "--limit", 3)
    assert r.exit_code == 0, r.output
    assert "3 prompts" in r.output and "τ" in r.output
    r = invoke("replay", rec, "--budgets", "4,8")
    assert r.exit_code == 0 and "| best-first |" in r.output and "| oracle" in r.output, r.output
    r = invoke("replay", rec, "--json", "--trees", "chain,best-first-marginal")
    doc = json.loads(r.stdout)
    assert doc["prompts"] == 3 and set(doc["tau"]) == {"chain", "best-first-marginal", "oracle"}
    assert doc["meta"]["drafter"] == "ngram"


def test_check_failure_exits_1(tiny_models, monkeypatch):
    target, _, _, prompts = tiny_models
    import w12.specdec.engine as engine

    real = engine.accept
    monkeypatch.setattr(engine, "accept", lambda tree, nxt: (lambda p, b: (p, (b + 1) % 256))(*real(tree, nxt)))
    r = invoke("generate", "--target", target, "--drafter", "ngram", "--prompts", prompts, "--max-new-tokens", 6,
               "--check", "--limit", 1)
    assert r.exit_code == 1 and "DIFFERS at token 1" in r.output and "0/1 identical" in r.output


def test_unusable_inputs_exit_2(tiny_models, tmp_path):
    target, _, other, prompts = tiny_models
    base = ["generate", "--target", target, "--prompts", prompts, "--max-new-tokens", 4]
    r = invoke(*base, "--drafter", other)
    assert r.exit_code == 2 and "share the target's tokenizer" in r.output
    r = invoke(*base, "--drafter", "self")
    assert r.exit_code == 2 and "--drafter-layers" in r.output
    r = invoke(*base, "--drafter", tmp_path / "nope")
    assert r.exit_code == 2 and "no model folder" in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hi"}\n')
    r = invoke("generate", "--target", target, "--prompts", bad, "--drafter", "ngram")
    assert r.exit_code == 2 and "turns" in r.output
    r = invoke("replay", tmp_path / "missing.json")
    assert r.exit_code == 2 and "no recording" in r.output
    r = invoke("replay", tmp_path / "missing.json", "--trees", "beam")
    assert r.exit_code == 2


def test_w12_targets_are_patched_lazily(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "w12"}}))
    calls = []
    monkeypatch.setattr(w12, "patch_transformers", lambda: calls.append(1), raising=False)
    _patch_if_w12(str(tmp_path))
    assert calls == [1]
    monkeypatch.delattr(w12, "patch_transformers")
    with pytest.raises(SystemExit) as e:
        _patch_if_w12(str(tmp_path))
    assert e.value.code == 2
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _patch_if_w12(str(tmp_path))          # a plain checkpoint: nothing to patch
