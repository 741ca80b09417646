"""Streaming conversion of a BF16 Hugging Face checkpoint to W12 (SPEC.md §7–8).

One output shard per input shard, same file names: memory holds one input tensor at a time and one
output shard. Each shard is written to a temporary file and renamed, so a file that exists is whole;
`resume=True` skips shards already written by an interrupted run with the same source and options.
config.json (with `quantization_config`) and the index are written last: a folder without them is an
unfinished conversion.
"""

import fnmatch
import hashlib
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from w12.formats.container import W12File, write_file
from w12.formats.layout import FORMAT_VERSION, TK, TN, stored_bytes
from w12.formats.matrix import W12Matrix

from .errors import DiskFullError, NotBF16Error, OutputExistsError, ResumeMismatchError
from .source import INDEX, other_files, resolve, weight_files

DEFAULT_EXCLUDE = ("*embed*", "*lm_head*")
MANIFEST = "w12_convert.json"
FLOATS = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}
ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass
class Options:
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    cast_bf16: bool = False


@dataclass
class TensorPlan:
    name: str
    file: str
    dtype: str
    shape: list[int]
    action: str  # "w12" or "copy"
    bytes_before: int
    bytes_after: int  # for "w12": without escapes (4 bytes each, unknown before encoding)


@dataclass
class Plan:
    source: str
    out: str
    options: Options
    files: list[str]
    copies: list[str]
    tensors: list[TensorPlan] = field(default_factory=list)

    @property
    def bytes_before(self) -> int:
        return sum(t.bytes_before for t in self.tensors)

    @property
    def bytes_after(self) -> int:
        return sum(t.bytes_after for t in self.tensors)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(bytes_before=self.bytes_before, bytes_after=self.bytes_after,
                 converted=sum(t.action == "w12" for t in self.tensors))
        return d


def hash_tensor(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes, row-major little-endian (SPEC.md §7)."""
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()


def wanted(name: str, options: Options) -> bool:
    return (any(fnmatch.fnmatchcase(name, p) for p in options.include)
            and not any(fnmatch.fnmatchcase(name, p) for p in options.exclude))


def make_plan(src: str, out: str, options: Options = Options()) -> Plan:
    """What convert would do: every tensor with its action and bytes before/after. Reads headers only."""
    folder = resolve(src)
    files = weight_files(folder)
    plan = Plan(str(folder), str(Path(out).expanduser().resolve()), options, files, other_files(folder, files))
    not_bf16 = []
    for file in files:
        with safe_open(folder / file, framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                dtype, shape = sl.get_dtype(), list(sl.get_shape())
                numel = 1
                for d in shape:
                    numel *= d
                before = numel * ITEMSIZE.get(dtype, 1)
                convert = len(shape) == 2 and name.endswith(".weight") and dtype in FLOATS and wanted(name, options)
                if convert and dtype != "BF16":
                    not_bf16.append((name, dtype))
                after = stored_bytes(shape[0], shape[1], 0) if convert else before
                plan.tensors.append(TensorPlan(name, file, dtype, shape, "w12" if convert else "copy", before, after))
    if not_bf16 and not options.cast_bf16:
        name, dtype = not_bf16[0]
        raise NotBF16Error(
            f"{len(not_bf16)} matrices to convert are not BF16 (first: {name} is {dtype}). W12 is exact for BF16 "
            "weights only; pass --cast-bf16 to cast them to BF16 first (a lossy cast, recorded in the metadata), "
            "or --exclude them")
    return plan


def quantization_config(plan: Plan, source_dtype: str | None) -> dict:
    converted = {t.name[: -len(".weight")] for t in plan.tensors if t.action == "w12"}
    kept = sorted({t.name[: -len(".weight")] for t in plan.tensors
                   if t.action == "copy" and len(t.shape) == 2 and t.name.endswith(".weight")} - converted)
    return {"quant_method": "w12", "format_version": FORMAT_VERSION, "tile": [TN, TK], "window": 16,
            "modules_to_not_convert": kept, "converted_count": len(converted),
            "include": list(plan.options.include), "exclude": list(plan.options.exclude),
            "cast_from": {"F32": "float32", "F16": "float16", "F64": "float64"}.get(source_dtype)
            if plan.options.cast_bf16 else None}


def prepare_output(plan: Plan, resume: bool, overwrite: bool) -> None:
    out = Path(plan.out)
    manifest = {"source": plan.source, "options": asdict(plan.options), "format_version": FORMAT_VERSION,
                "files": {f: (Path(plan.source) / f).stat().st_size for f in plan.files}}
    if out.exists() and any(out.iterdir()):
        if overwrite:
            shutil.rmtree(out)
        elif resume:
            old = json.loads((out / MANIFEST).read_text()) if (out / MANIFEST).exists() else None
            if old != json.loads(json.dumps(manifest)):
                raise ResumeMismatchError(f"{out} was not started by `w12 convert` with this source and these "
                                          "options; use --overwrite to start again, or another output folder")
            for stale in out.glob("*.tmp-*"):  # partial files of the interrupted run
                stale.unlink()
            return
        else:
            raise OutputExistsError(f"output folder {out} is not empty; pass --resume to continue an interrupted "
                                    "conversion, --overwrite to replace it, or choose an empty folder")
    free = shutil.disk_usage(_existing_parent(out)).free
    need = int(plan.bytes_after * 1.01) + sum((Path(plan.source) / c).stat().st_size for c in plan.copies)
    if need > free:
        raise DiskFullError(f"the output needs about {need / 1e9:.2f} GB but only {free / 1e9:.2f} GB are free "
                            f"under {out}; free some space or choose another output folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _existing_parent(p: Path) -> Path:
    while not p.exists():
        p = p.parent
    return p


def convert_shard(plan: Plan, file: str, progress=None) -> None:
    """Convert one input shard into the output shard of the same name."""
    dense, matrices, hashes = {}, {}, {}
    # SHA-256 runs in a thread (hashlib releases the GIL) while the next tensor is encoded.
    with safe_open(Path(plan.source) / file, framework="pt") as f, ThreadPoolExecutor(1) as pool:
        for t in (t for t in plan.tensors if t.file == file):
            x = f.get_tensor(t.name)
            if t.action == "w12":
                x = x.to(torch.bfloat16) if x.dtype != torch.bfloat16 else x
                hashes[t.name] = pool.submit(hash_tensor, x)
                matrices[t.name] = W12Matrix.from_bf16(x)
            else:
                hashes[t.name] = pool.submit(hash_tensor, x)
                dense[t.name] = x
            if progress:
                progress(t.bytes_before)
    sha = {name: h.result() for name, h in hashes.items()}
    write_file(Path(plan.out) / file, dense, matrices, sha256=sha,
               metadata={"w12.source_file": file, "w12.source_size": str((Path(plan.source) / file).stat().st_size)})


def shard_done(plan: Plan, file: str) -> bool:
    path = Path(plan.out) / file
    if not path.exists():
        return False
    try:
        with W12File(path) as f:
            return f.metadata.get("w12.source_file") == file
    except Exception:
        return False


def finish(plan: Plan) -> None:
    """Copy the other files, write config.json with quantization_config and the index: last."""
    src, out = Path(plan.source), Path(plan.out)
    for rel in plan.copies:
        if rel == "config.json":
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, out / rel)
    if len(plan.files) > 1 or (src / INDEX).exists():
        index = {"metadata": {"total_size": sum((out / f).stat().st_size for f in plan.files)},
                 "weight_map": _weight_map(plan)}
        _write_json(out / INDEX, index)
    config = json.loads((src / "config.json").read_text()) if (src / "config.json").exists() else {}
    dtypes = {t.dtype for t in plan.tensors if t.action == "w12"}
    config["quantization_config"] = quantization_config(plan, next(iter(dtypes - {"BF16"}), None))
    if plan.options.cast_bf16 or "dtype" in config or "torch_dtype" in config:
        config["dtype"] = "bfloat16" if dtypes else config.get("dtype", config.get("torch_dtype"))
        config.pop("torch_dtype", None)
    _write_json(out / "config.json", config)


def _weight_map(plan: Plan) -> dict[str, str]:
    from w12.formats.layout import companion_names

    wm = {}
    for t in plan.tensors:
        names = companion_names(t.name).values() if t.action == "w12" else [t.name]
        wm.update({n: t.file for n in names})
    return dict(sorted(wm.items()))


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(path)


def convert(src: str, out: str, options: Options = Options(), resume: bool = False, overwrite: bool = False,
            progress: bool = False) -> Plan:
    """Convert checkpoint `src` (folder or Hub id) into the W12 checkpoint folder `out`."""
    plan = make_plan(src, out, options)
    prepare_output(plan, resume, overwrite)
    bar = _bar(plan.bytes_before, progress)
    for file in plan.files:
        if resume and shard_done(plan, file):
            bar.update(sum(t.bytes_before for t in plan.tensors if t.file == file))
            continue
        try:
            convert_shard(plan, file, bar.update)
        except DiskFullError:
            raise DiskFullError(f"the disk under {plan.out} filled up while writing {file}; the shards written "
                                "so far are complete: free space and re-run with --resume") from None
    bar.close()
    finish(plan)
    return plan


def _bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="converting", disable=not enabled)
