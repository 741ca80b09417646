"""The converter CLI: convert → verify → decode exactness, corruption detection, interruption and resume,
and clear errors (exit 2, nothing written)."""

import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from checkpoints import tiny_llama
from w12.cli import main
from w12.convert.checkpoint import verify
from w12.convert.fixtures import minilm_fp32, smollm2_bf16


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def all_tensors(folder):
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(f, framework="pt") as g:
            out.update({n: g.get_tensor(n) for n in g.keys()})
    return out


def assert_same_tensors(a, b, cast=False):
    ta, tb = all_tensors(a), all_tensors(b)
    assert ta.keys() == tb.keys()
    for name, x in ta.items():
        y = tb[name]
        if cast and y.dtype != x.dtype:  # the source was cast to BF16 before conversion
            y = y.to(x.dtype)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.contiguous().view(torch.uint8).equal(y.contiguous().view(torch.uint8)), name


def round_trip(src, tmp_path, *flags, cast=False):
    w12dir, back = tmp_path / "w12", tmp_path / "back"
    r = cli("convert", src, w12dir, *flags)
    assert r.exit_code == 0, r.output
    r = cli("verify", w12dir)
    assert r.exit_code == 0, r.output
    r = cli("verify", w12dir, src)
    assert r.exit_code == 0, r.output
    r = cli("decode", w12dir, back)
    assert r.exit_code == 0, r.output
    assert_same_tensors(back, src, cast=cast)
    return w12dir


def test_round_trip_tiny_llama_sharded(tmp_path):
    src = tiny_llama(tmp_path / "src", max_shard_size="300KB")
    assert len(list(src.glob("*.safetensors"))) > 1
    w12dir = round_trip(src, tmp_path)
    assert (w12dir / "model.safetensors.index.json").exists()
    r = cli("inspect", w12dir, "--json")
    assert r.exit_code == 0 and '"bits_per_weight"' in r.output and '"bytes_w12"' in r.output


def test_round_trip_smollm2(tmp_path):
    w12dir = round_trip(smollm2_bf16(), tmp_path)
    assert (w12dir / "tokenizer.json").exists() and (w12dir / "chat_template.jinja").exists()


def test_round_trip_minilm_cast(tmp_path):
    src = minilm_fp32()
    r = cli("convert", src, tmp_path / "refused")
    assert r.exit_code == 2 and "--cast-bf16" in r.output and not (tmp_path / "refused").exists()
    w12dir = round_trip(src, tmp_path, "--cast-bf16", cast=True)
    import json
    assert json.loads((w12dir / "config.json").read_text())["quantization_config"]["cast_from"] == "float32"
    assert (w12dir / "1_Pooling" / "config.json").exists()


def data_region(path):
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    return 8 + n, path.stat().st_size


def test_every_bit_flip_is_caught(tmp_path):
    """≥ 100 random single-bit flips in tensor data: verify reports a mismatch (exit 1) every time."""
    src = tiny_llama(tmp_path / "src", hidden=64)
    w12dir = tmp_path / "w12"
    assert cli("convert", src, w12dir).exit_code == 0
    shard = w12dir / "model.safetensors"
    clean = shard.read_bytes()
    start, end = data_region(shard)
    rng = random.Random(0)
    for i in range(120):
        data = bytearray(clean)
        pos = rng.randrange(start, end)
        data[pos] ^= 1 << rng.randrange(8)
        shard.write_bytes(bytes(data))
        if i < 3:  # through the CLI: exit status 1, the bad tensor named
            r = cli("verify", w12dir)
            assert r.exit_code == 1 and "MISMATCH" in r.output, (pos, r.output)
        else:
            assert not verify(w12dir).ok, f"flip at byte {pos} not caught"
    shard.write_bytes(clean)
    assert verify(w12dir).ok


def test_mismatch_names_row_and_column(tmp_path):
    src = tiny_llama(tmp_path / "src", hidden=64)
    w12dir = tmp_path / "w12"
    assert cli("convert", src, w12dir).exit_code == 0
    other = tmp_path / "other"
    shutil.copytree(src, other)
    from safetensors.torch import load_file, save_file
    t = load_file(other / "model.safetensors")
    w = t["model.layers.1.mlp.up_proj.weight"]
    w[5, 17] = w[5, 17] * 2 + 1
    save_file(t, other / "model.safetensors", metadata={"format": "pt"})
    r = cli("verify", w12dir, other)
    assert r.exit_code == 1
    assert "model.layers.1.mlp.up_proj.weight at row 5, column 17" in r.output


def test_kill_9_then_resume(tmp_path):
    src = tiny_llama(tmp_path / "src", layers=6, hidden=256, max_shard_size="400KB")
    shards = sorted(src.glob("model-*.safetensors"))
    assert len(shards) >= 4
    out = tmp_path / "w12"
    proc = subprocess.Popen([sys.executable, "-m", "w12.cli", "convert", str(src), str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("model-*.safetensors")):
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "config.json").exists() or len(list(out.glob("model-*.safetensors"))) == len(shards)
    assert cli("verify", out).exit_code == 2  # unfinished conversion: unusable, says so
    assert cli("convert", src, out).exit_code == 2  # not empty
    r = cli("convert", src, out, "--resume")
    assert r.exit_code == 0, r.output
    assert not list(out.glob("*.tmp-*"))
    assert cli("verify", out, src).exit_code == 0


@pytest.mark.parametrize("case", ["missing", "no-safetensors", "bin-only", "not-empty", "disk-full", "hub-offline"])
def test_clear_errors_exit_2_nothing_written(tmp_path, case, monkeypatch):
    src = tmp_path / "src"
    out = tmp_path / "out"
    if case == "missing":
        src = tmp_path / "nope"
    elif case == "no-safetensors":
        src.mkdir()
        (src / "config.json").write_text("{}")
    elif case == "bin-only":
        src.mkdir()
        (src / "pytorch_model.bin").write_bytes(b"\x80\x02 not unpickled")
    else:
        tiny_llama(src, hidden=64)
    if case == "not-empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    if case == "disk-full":
        monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    if case == "hub-offline":
        src = "some-org/some-model"
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = cli("convert", src, out)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ")
    expected = {"missing": "no such folder", "no-safetensors": "no *.safetensors", "bin-only": "never unpickles",
                "not-empty": "not empty", "disk-full": "free", "hub-offline": "local folder"}[case]
    assert expected in r.output
    if case == "not-empty":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()


def test_disk_full_while_writing(tmp_path, monkeypatch):
    """ENOSPC in the middle of a shard: exit 2, no partial file left, resumable."""
    src = tiny_llama(tmp_path / "src", hidden=64)
    out = tmp_path / "out"
    import safetensors.torch as st

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(st, "save_file", full)
    monkeypatch.setattr("w12.formats.container.save_file", full)
    r = cli("convert", src, out)
    assert r.exit_code == 2 and "filled up" in r.output
    assert not list(out.glob("*.safetensors*"))


def test_dry_run_and_json(tmp_path):
    src = tiny_llama(tmp_path / "src", hidden=64)
    r = cli("convert", src, tmp_path / "out", "--dry-run")
    assert r.exit_code == 0 and "would convert 14 of 21" in r.output
    assert not (tmp_path / "out").exists()
    r = cli("convert", src, tmp_path / "out", "--dry-run", "--json", "--exclude", "*mlp*")
    import json
    plan = json.loads(r.output)
    # --exclude replaces the default exclusions: embed_tokens and lm_head are converted now, the 6 MLPs not
    assert plan["converted"] == 10 and plan["bytes_before"] > 0 and plan["bytes_after"] > 0
