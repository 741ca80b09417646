"""Publishing a W12 checkpoint on the Hugging Face Hub (huggingface_hub 2.x).

`plan_upload` (offline: what would be uploaded, and the model card), `model_card` (the generated
README.md), `tensor_digest` (the verification hash written into the card) and `upload` (verify, then
create the repo and upload). Errors are W12Error subclasses defined here; the CLI maps them to exit 2.

How the card reaches the repo without touching the user's folder: `upload` stages a temporary folder
that mirrors the checkpoint with symbolic links (hard links, then copies, where links are not
possible) and holds the generated README.md as the only real file, and hands that folder to
`HfApi.upload_folder`. One call therefore uploads weights and card together (one commit, or on large
folders the resumable batches that `upload_folder` makes with hf_xet in 2.x, with its own progress
display), and re-running an interrupted upload resumes it: the card is deterministic, so files
already on the Hub are skipped. `create_commit` with a CommitOperationAdd for the card would also be
one commit, but it loses 2.x's batching/resume of large folders.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from w12.formats.container import W12File
from w12.formats.errors import W12Error

from .checkpoint import inspect, verify, w12_files
from .convert import MANIFEST

CARD = "README.md"
# Never uploaded: git metadata, huggingface_hub's local-dir cache, temporary files of an interrupted
# write, and the conversion manifest (resume state holding local paths of the converting machine).
IGNORE_PATTERNS = (".git/*", "*/.git/*", ".cache/*", "*.tmp", MANIFEST)
TAGS = ("w12", "lossless", "bf16", "12-bit", "quantized")
DIGEST_NAME = "w12-tensor-sha256"


class UploadError(W12Error):
    """Base class of the errors of `w12 upload`."""


class BadRepoIdError(UploadError):
    """A repo id (target or --base-model) is not a valid Hugging Face repo id."""


class UnverifiedCheckpointError(UploadError):
    """`w12 verify` rejects the folder: it is not uploaded."""


class NotLoggedInError(UploadError):
    """No Hugging Face token: no --token, no HF_TOKEN, no saved login."""


class HubOfflineError(UploadError):
    """The Hub cannot be reached (no network, wrong endpoint, HF_HUB_OFFLINE set)."""


class HubAuthError(UploadError):
    """The Hub rejected the token or the token may not write to the repo."""


class HubRequestError(UploadError):
    """The Hub answered a request with an error (repo or revision not found, server error, ...)."""


class CardError(UploadError):
    """The model card (generated or the user's README.md) has invalid metadata."""


@dataclass
class FileEntry:
    path: str  # relative, POSIX
    size: int


@dataclass
class UploadPlan:
    folder: str
    repo_id: str
    revision: str | None
    private: bool | None
    commit_message: str
    files: list[FileEntry]  # what goes up, README.md included (generated or the user's)
    ignored: list[str]
    card: str  # "generated" or "user"
    card_text: str | None  # the generated README.md; None when the user's is kept
    base_model: str | None
    base_model_source: str | None  # "option", "conversion source", "config _name_or_path" or None
    pipeline_tag: str | None
    digest: str
    stats: dict = field(default_factory=dict)  # inspect() totals

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict:
        return {"folder": self.folder, "repo_id": self.repo_id, "revision": self.revision, "private": self.private,
                "commit_message": self.commit_message, "files": [vars(f) for f in self.files],
                "ignored": self.ignored, "total_bytes": self.total_bytes, "card": self.card,
                "base_model": self.base_model, "base_model_source": self.base_model_source,
                "pipeline_tag": self.pipeline_tag, "digest": {DIGEST_NAME: self.digest}, "stats": self.stats}


@dataclass
class UploadResult:
    plan: UploadPlan
    repo_url: str
    commit_url: str | None
    commit_oid: str | None


# ---------------------------------------------------------------------------------------------------
# Offline pieces: repo ids, base model, pipeline tag, digest, card, plan.


def check_repo_id(repo_id: str, what: str = "repo id") -> str:
    """Validate with huggingface_hub's own validator (no request); BadRepoIdError if invalid."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise BadRepoIdError(f"invalid {what} {repo_id!r}: {e} Expected 'namespace/name' (letters, digits, "
                             "'-', '_', '.'; at most 96 characters)") from None
    if not repo_id:
        raise BadRepoIdError(f"invalid {what}: empty")
    return repo_id


def looks_like_hub_id(s) -> bool:
    """'org/name' that huggingface_hub accepts and that does not look like a local path."""
    if not isinstance(s, str) or s.count("/") != 1 or s.startswith((".", "/", "~")) or "\\" in s or ":" in s:
        return False
    try:
        check_repo_id(s)
    except BadRepoIdError:
        return False
    return True


_HF_CACHE_SNAPSHOT = re.compile(r"models--([^/\\]+?)--([^/\\]+)[/\\]snapshots[/\\]([0-9a-f]{40})(?:[/\\]|$)")


def guess_base_model(config: dict, manifest: dict | None) -> tuple[str | None, str | None, str | None]:
    """(base model id, where it came from, source revision) from the conversion, else (None, None, None).

    1. the conversion source recorded in w12_convert.json, when `w12 convert` fetched a Hub id (the
       folder is a huggingface_hub cache snapshot `models--ORG--NAME/snapshots/REV`): exact id and revision;
    2. config.json's `_name_or_path`, when it looks like a Hub id rather than a local path.
    """
    source = (manifest or {}).get("source")
    if isinstance(source, str):
        m = _HF_CACHE_SNAPSHOT.search(source)
        if m and looks_like_hub_id(f"{m.group(1)}/{m.group(2)}"):
            return f"{m.group(1)}/{m.group(2)}", "conversion source", m.group(3)
    name = config.get("_name_or_path")
    if looks_like_hub_id(name):
        return name, "config _name_or_path", None
    return None, None, None


_PIPELINES = (  # (architecture suffix, pipeline tag, Auto class)
    ("ForCausalLM", "text-generation", "AutoModelForCausalLM"),
    ("LMHeadModel", "text-generation", "AutoModelForCausalLM"),
    ("ForMaskedLM", "fill-mask", "AutoModelForMaskedLM"),
    ("ForSequenceClassification", "text-classification", "AutoModelForSequenceClassification"),
    ("ForTokenClassification", "token-classification", "AutoModelForTokenClassification"),
    ("ForQuestionAnswering", "question-answering", "AutoModelForQuestionAnswering"),
    ("ForImageClassification", "image-classification", "AutoModelForImageClassification"),
    ("Model", "feature-extraction", "AutoModel"),  # bare encoders/decoders: BertModel, LlamaModel, ...
)


def pipeline_for(config: dict) -> tuple[str | None, str]:
    """(pipeline_tag or None when unsure, transformers Auto class) from config.json's architectures."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else ""
    for suffix, tag, auto in _PIPELINES:
        if arch.endswith(suffix):
            return tag, auto
    if arch.endswith("ForConditionalGeneration") and "vision_config" in config:
        return "image-text-to-text", "AutoModelForImageTextToText"
    return None, "AutoModel"


def tensor_digest(folder: str | Path) -> str:
    """The checkpoint's verification hash, `w12-tensor-sha256`.

    SHA-256 (hex) of the UTF-8 text made of one line `NAME<TAB>SHA256<LF>` per tensor, sorted by name,
    where SHA256 is the hex SHA-256 of the tensor's original bytes (BF16 for converted matrices;
    row-major, little-endian). For a W12 folder these per-tensor hashes are read from the W12 headers
    (recorded at conversion, checked by `w12 verify`); for a plain safetensors checkpoint they are
    computed from the tensors. The two agree exactly when the W12 checkpoint decodes to that
    checkpoint, independent of sharding, file names and the other files.
    """
    folder = Path(folder).expanduser()
    hashes: dict[str, str] = {}
    try:
        _, files, _ = w12_files(folder)
    except W12Error:
        from safetensors import safe_open

        from .convert import hash_tensor
        from .source import weight_files

        for file in weight_files(folder):
            with safe_open(folder / file, framework="pt") as f:
                hashes.update({n: hash_tensor(f.get_tensor(n)) for n in f.keys()})
    else:
        for file in files:
            with W12File(folder / file) as f:
                for name, info in f.header.matrices.items():
                    hashes[name] = info.sha256
                for name in f.dense_names:
                    hashes[name] = f.header.dense_sha256.get(name)
        missing = sorted(n for n, h in hashes.items() if not h)
        if missing:
            raise UnverifiedCheckpointError(f"{folder}: tensor {missing[0]} (and {len(missing) - 1} more) has no "
                                            "recorded sha256; re-convert it with `w12 convert`")
    text = "".join(f"{name}\t{hashes[name]}\n" for name in sorted(hashes))
    return hashlib.sha256(text.encode()).hexdigest()


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return str(n)


def model_card(repo_id: str, config: dict, stats: dict, digest: str, *, base_model: str | None = None,
               base_revision: str | None = None, files_bytes: int | None = None) -> str:
    """The README.md for a W12 repo: YAML metadata (ModelCardData) + a body that says what W12 is, the
    sizes, how to load it and how to check it. Deterministic: the same inputs give the same text."""
    from huggingface_hub import ModelCard, ModelCardData

    from w12 import __version__
    from w12.formats.layout import FORMAT_VERSION

    tag, auto = pipeline_for(config)
    tags = list(TAGS)
    if isinstance(config.get("model_type"), str) and config["model_type"] not in tags:
        tags.append(config["model_type"])
    extra = {"base_model_relation": "quantized"} if base_model else {}
    data = ModelCardData(base_model=base_model, library_name="transformers", pipeline_tag=tag, tags=tags, **extra)

    name = repo_id.split("/")[-1]
    base = f"[{base_model}](https://huggingface.co/{base_model})" if base_model else "a BF16 model"
    if base_model and base_revision:
        base += f" (revision `{base_revision}`)"
    bpw, esc = stats.get("bits_per_weight"), stats.get("escape_rate")
    rows = [
        f"| tensors, as BF16 | {_human(stats['bytes_bf16'])} |",
        f"| tensors, as W12 | {_human(stats['bytes_w12'])} ({stats['ratio']:.1%} of BF16) |" if stats.get("ratio")
        else f"| tensors, as W12 | {_human(stats['bytes_w12'])} |",
        f"| converted matrices | {stats['matrices']} of {stats['num_tensors']} tensors, "
        f"{stats['weights_converted']:,} weights |",
    ]
    if bpw is not None:
        rows.append(f"| bits per weight (converted matrices, with padding and escapes) | {bpw:.4f} (BF16: 16) |")
    if esc is not None:
        rows.append(f"| escape rate (weights stored as exact 16-bit escapes) | {esc:.3e} |")
    if files_bytes is not None:
        rows.append(f"| files in this repo, besides this README | {_human(files_bytes)} |")
    load = [
        "```bash", "pip install w12", "```", "", "```python", "import w12", "",
        "w12.patch_transformers()  # registers the `w12` quantization method: call before from_pretrained",
        "", f"from transformers import {auto}, AutoTokenizer", "",
        f'model = {auto}.from_pretrained("{repo_id}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")', "```", "",
        "Without `w12.patch_transformers()`, Transformers does not know `quant_method: w12` and must not be "
        "trusted to load this checkpoint (the W12 matrices would not be read as weights).",
    ]
    if tag == "text-generation":
        load += ["", "SGLang:", "", "```bash", 'pip install "w12[sglang]"',
                 f"python -m sglang.launch_server --model-path {repo_id} --quantization w12", "```"]
    body = "\n".join([
        f"# {name}", "",
        f"This is {base} stored in **W12**: every converted BF16 weight matrix is kept in 12 bits per weight "
        "plus a short list of exact 16-bit escapes, and decodes to the **original BF16 bit patterns, "
        "bit for bit**. W12 is lossless: outputs are those of the BF16 model, not an approximation. "
        "Tensors that are not converted (by default embeddings, the LM head, norms and biases) are stored "
        "unchanged. The files are ordinary safetensors; `config.json` carries "
        "`quantization_config.quant_method: w12`.", "",
        "## Size", "", "| | |", "|---|---|", *rows, "",
        "## How to use", "", *load, "",
        "## Verification", "",
        f"`{DIGEST_NAME}`: `{digest}`", "",
        "This is the SHA-256 of the text made of one line `NAME<TAB>SHA256<LF>` per tensor, sorted by name, "
        "where SHA256 is the SHA-256 of that tensor's original bytes (BF16 for converted matrices, row-major, "
        "little-endian) as recorded in the W12 headers at conversion. It does not depend on sharding or file "
        "names, and the original BF16 checkpoint gives the same value. To check a download:", "",
        "```bash",
        "w12 verify ./downloaded-folder                # decode every tensor and compare with the recorded SHA-256",
        "w12 verify ./downloaded-folder ./original-bf16  # or bit by bit against the original checkpoint",
        "python -c \"from w12.convert.hub import tensor_digest; print(tensor_digest('./downloaded-folder'))\"",
        "```", "",
        f"Converted with w12 {__version__} (W12 format version {FORMAT_VERSION}). `w12 verify` passed "
        "before upload.", "",
    ])
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
    return str(card)


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _walk(folder: Path) -> tuple[list[FileEntry], list[str]]:
    from huggingface_hub.utils import filter_repo_objects

    all_files = sorted(p.relative_to(folder).as_posix() for p in folder.glob("**/*") if p.is_file())
    kept = set(filter_repo_objects(all_files, ignore_patterns=list(IGNORE_PATTERNS)))
    files = [FileEntry(rel, (folder / rel).stat().st_size) for rel in all_files if rel in kept]
    return files, [rel for rel in all_files if rel not in kept]


def plan_upload(folder: str | Path, repo_id: str, *, base_model: str | None = None, revision: str | None = None,
                private: bool | None = None, commit_message: str | None = None) -> UploadPlan:
    """What `upload` would send: files, the card (generated, or the user's README.md), base model,
    digest, sizes. Offline, reads headers only (no verification: `upload` verifies)."""
    check_repo_id(repo_id)
    if base_model is not None:
        check_repo_id(base_model, "--base-model")
    folder, _, config = w12_files(folder)
    folder = folder.resolve()
    stats = {k: v for k, v in inspect(folder).items() if k != "tensors"}
    digest = tensor_digest(folder)
    if base_model:
        base, how, base_rev = base_model, "option", None
    else:
        base, how, base_rev = guess_base_model(config, _read_json(folder / MANIFEST))
    files, ignored = _walk(folder)
    user_card = any(f.path == CARD for f in files)
    card_text = None
    if not user_card:
        card_text = model_card(repo_id, config, stats, digest, base_model=base, base_revision=base_rev,
                               files_bytes=sum(f.size for f in files))
        files.append(FileEntry(CARD, len(card_text.encode())))
        files.sort(key=lambda f: f.path)
    return UploadPlan(
        folder=str(folder), repo_id=repo_id, revision=revision, private=private,
        commit_message=commit_message or f"Upload W12 checkpoint ({stats['matrices']} matrices, lossless 12-bit)",
        files=files, ignored=ignored, card="user" if user_card else "generated", card_text=card_text,
        base_model=base, base_model_source=how, pipeline_tag=pipeline_for(config)[0], digest=digest, stats=stats)


# ---------------------------------------------------------------------------------------------------
# Network part.


@contextmanager
def _hub_errors(repo_id: str, endpoint: str):
    """Turn huggingface_hub / httpx errors into UploadError subclasses with a next step."""
    import httpx2
    from huggingface_hub.errors import (HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    try:
        yield
    except OfflineModeIsEnabled:
        raise HubOfflineError("HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: unset it to upload") from None
    except RevisionNotFoundError as e:
        raise HubRequestError(f"revision not found in {repo_id}: {_short(e)}") from None
    except RepositoryNotFoundError:
        raise HubRequestError(f"{repo_id} was not found on {endpoint}, or your token may not access it; check the "
                              "repo id and that the token belongs to its owner") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            raise HubAuthError(f"{endpoint} rejected the token (401): log in with `hf auth login`, set HF_TOKEN, "
                               "or pass --token with a token that has write access") from None
        if status == 403:
            raise HubAuthError(f"the token may not write to {repo_id} (403): use a token with write access to "
                               "that namespace (fine-grained tokens need 'write' on it)") from None
        raise HubRequestError(f"the Hub refused the upload to {repo_id} (HTTP {status}): {_short(e)}") from None
    except httpx2.TransportError as e:
        raise HubOfflineError(f"cannot reach the Hugging Face Hub at {endpoint} ({type(e).__name__}: {_short(e)}); "
                              "check the network connection, proxy settings or HF_ENDPOINT, then re-run "
                              "(files already uploaded are skipped)") from None


def _short(e: Exception, n: int = 300) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    for how in (os.symlink, os.link, shutil.copy2):
        try:
            how(src, dst)
            return
        except OSError:
            continue
    raise UploadError(f"cannot stage {src} for upload in {dst.parent}")


@contextmanager
def staged(plan: UploadPlan):
    """A temporary folder mirroring the checkpoint by links, plus the generated README.md."""
    with tempfile.TemporaryDirectory(prefix="w12-upload-") as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        for f in plan.files:
            if f.path == CARD and plan.card_text is not None:
                (root / CARD).write_text(plan.card_text, encoding="utf-8")
            else:
                _link(Path(plan.folder) / f.path, root / f.path)
        yield root


def upload(folder: str | Path, repo_id: str, *, token: str | None = None, private: bool | None = None,
           revision: str | None = None, commit_message: str | None = None, base_model: str | None = None,
           endpoint: str | None = None, progress: bool = True, echo=None) -> UploadResult:
    """Verify `folder`, then create `repo_id` (if needed) and upload the checkpoint with its model card.

    Nothing is sent unless the repo id is valid, a token is available and `w12 verify` accepts every
    tensor. The token (argument, else HF_TOKEN, else the saved login) is handed to huggingface_hub
    and never printed or written. `echo(str)` receives one line per step.
    """
    from huggingface_hub import HfApi, constants
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars, \
        get_token

    say = echo or (lambda s: None)
    plan = plan_upload(folder, repo_id, base_model=base_model, revision=revision, private=private,
                       commit_message=commit_message)
    endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
    if constants.is_offline_mode():
        raise HubOfflineError("HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: unset it to upload")
    if not (token or get_token()):
        raise NotLoggedInError("not logged in to the Hugging Face Hub: run `hf auth login`, set HF_TOKEN, or pass "
                               "--token (a token with write access)")

    say(f"verifying {plan.folder} ...")
    report = verify(plan.folder, progress=progress)
    if not report.ok:
        raise UnverifiedCheckpointError(f"`w12 verify` rejects {plan.folder}: {report.mismatches[0]}; nothing was "
                                        "uploaded. Re-convert the checkpoint (or restore the damaged file)")
    say(f"verified: {report.tensors} tensors ({report.matrices} W12 matrices) match their recorded SHA-256")
    say("model card: " + ("keeping your README.md" if plan.card == "user" else
                          f"generated README.md (base_model: {plan.base_model or 'unknown'}, "
                          f"pipeline_tag: {plan.pipeline_tag or 'none'})"))

    api = HfApi(endpoint=endpoint, token=token, library_name="w12", library_version=_version())
    bars_were_off = are_progress_bars_disabled()
    if not progress:
        disable_progress_bars()
    try:
        with _hub_errors(repo_id, endpoint):
            repo = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
            target = repo.repo_id or repo_id
            if revision and revision != constants.DEFAULT_REVISION and not revision.startswith("refs/"):
                api.create_branch(target, branch=revision, repo_type="model", exist_ok=True)
            say(f"uploading {len(plan.files)} files ({_human(plan.total_bytes)}) to {target}"
                + (f" (revision {revision})" if revision else ""))
            with staged(plan) as root:
                try:
                    info = api.upload_folder(repo_id=target, folder_path=root, repo_type="model", revision=revision,
                                             commit_message=plan.commit_message,
                                             commit_description=f"{DIGEST_NAME}: {plan.digest}",
                                             ignore_patterns=list(IGNORE_PATTERNS))
                except ValueError as e:  # README.md metadata rejected by /api/validate-yaml
                    if "yaml" in str(e).lower() or "metadata" in str(e).lower():
                        raise CardError(f"the Hub rejects the README.md metadata: {_short(e)}"
                                        + (" (your README.md; fix its YAML header)" if plan.card == "user" else ""))
                    raise
    finally:
        if not progress and not bars_were_off:
            enable_progress_bars()
    return UploadResult(plan, str(repo), getattr(info, "commit_url", None), getattr(info, "oid", None))


def _version() -> str:
    from w12 import __version__

    return __version__
