"""Walking a Hugging Face checkpoint folder: which files hold weights, which are copied as they are."""

import json
import os
from pathlib import Path

from .errors import HubUnreachableError, BadIndexError, NoSafetensorsError, PickleOnlyError, SourceNotFoundError

INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
SKIP_DIRS = {".git", ".cache", "__pycache__"}


def resolve(src: str) -> Path:
    """A local folder, or a Hub id fetched with huggingface_hub (safetensors and metadata files only)."""
    p = Path(src).expanduser()
    if p.is_dir():
        return p.resolve()
    if p.exists():
        raise SourceNotFoundError(f"{src} is a file; pass the checkpoint folder that holds config.json and "
                                  "the *.safetensors files")
    if src.count("/") != 1 or src.startswith((".", "/")):
        raise SourceNotFoundError(f"no such folder: {src}; pass a local checkpoint folder or a Hub id (org/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(src, allow_patterns=["*.safetensors", "*.json", "*.txt", "*.model",
                                                           "*.jinja", "*.md", "*.py", "tokenizer*"]))
    except Exception as e:  # offline, unknown repo, auth: all end here
        raise HubUnreachableError(f"cannot fetch {src!r} from the Hugging Face Hub ({type(e).__name__}: "
                                  f"{str(e)[:200]}); download it elsewhere and pass the local folder instead") from None


def weight_files(folder: Path) -> list[str]:
    """The safetensors shards of a checkpoint, in index order, as paths relative to `folder`."""
    index = folder / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise BadIndexError(f"{index} is not a valid safetensors index ({e}); fix or remove it") from None
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise BadIndexError(f"{index} names {len(missing)} missing file(s), e.g. {missing[0]}")
        return files
    files = sorted(str(p.relative_to(folder)) for p in folder.glob("*.safetensors"))
    if files:
        return files
    pickles = [p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES]
    if pickles:
        raise PickleOnlyError(
            f"{folder} holds only pickle weights ({', '.join(sorted(pickles)[:3])}); W12 never unpickles files. "
            "Convert them to safetensors first, in an environment you trust: "
            "`AutoModel.from_pretrained(folder).save_pretrained(out, safe_serialization=True)`")
    raise NoSafetensorsError(f"no *.safetensors files in {folder}; expected a Hugging Face checkpoint folder")


def other_files(folder: Path, weights: list[str]) -> list[str]:
    """Every other file to copy unchanged (config, tokenizer, README, …); pickles and indexes excluded."""
    skip = set(weights) | {INDEX}
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for f in sorted(files):
            rel = str((Path(root) / f).relative_to(folder))
            if (rel not in skip and not f.startswith(".") and not f.endswith(PICKLE_SUFFIXES)
                    and not f.endswith(".safetensors")):
                out.append(rel)
    return out
