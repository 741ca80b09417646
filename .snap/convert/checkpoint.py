"""Reading a converted W12 checkpoint folder: verify (by bits), inspect (sizes), decode (back to BF16)."""

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from w12.formats.container import W12File
from w12.formats.errors import W12Error
from w12.formats.layout import companion_names

from .convert import _write_json, hash_tensor
from .errors import NotW12CheckpointError, OutputExistsError
from .source import INDEX, other_files, weight_files


def w12_files(folder: str | Path) -> tuple[Path, list[str], dict]:
    """(folder, shard names, config) of a finished W12 conversion, else NotW12CheckpointError."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise NotW12CheckpointError(f"no such folder: {folder}")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") != "w12":
        hint = " (an unfinished conversion? re-run `w12 convert --resume`)" if (folder / "w12_convert.json").exists() else ""
        raise NotW12CheckpointError(f"{folder} is not a W12 checkpoint: config.json has no quantization_config "
                                    f"with quant_method 'w12'{hint}")
    try:
        return folder, weight_files(folder), config
    except W12Error as e:
        raise NotW12CheckpointError(f"{folder}: {e}") from None


@dataclass
class Mismatch:
    tensor: str
    reason: str
    row: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = f" at row {self.row}, column {self.col}" if self.row is not None else ""
        return f"{self.tensor}{where}: {self.reason}"


@dataclass
class VerifyReport:
    tensors: int = 0
    matrices: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def first_difference(a: torch.Tensor, b: torch.Tensor):
    """(row, col) of the first differing bit pattern of two equally shaped tensors, or None."""
    if a.shape != b.shape:
        return "shape"
    diff = a.reshape(a.shape[0], -1) != b.reshape(b.shape[0], -1) if a.dim() else (a != b).reshape(1, 1)
    idx = torch.nonzero(diff)
    return None if idx.numel() == 0 else tuple(int(i) for i in idx[0])


def bits(t: torch.Tensor) -> torch.Tensor:
    """A view that compares by bits: integers as they are, floats as same-width integers."""
    if t.is_floating_point():
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def original_tensors(original: str | Path) -> dict[str, Path]:
    folder = Path(original).expanduser()
    names = {}
    for file in weight_files(folder):
        with safe_open(folder / file, framework="pt") as f:
            names.update({n: folder / file for n in f.keys()})
    return names


def verify(folder: str | Path, original: str | Path | None = None, progress: bool = False,
           stop_at_first: bool = True) -> VerifyReport:
    """Decode every tensor; compare bits with `original`, or with the SHA-256 stored at conversion."""
    folder, files, config = w12_files(folder)
    cast = (config["quantization_config"] or {}).get("cast_from")
    orig = original_tensors(original) if original is not None else None
    report = VerifyReport()
    seen = set()
    from tqdm.auto import tqdm

    for file in tqdm(files, desc="verifying", unit="shard", disable=not progress):
        try:
            f = W12File(folder / file)
        except W12Error as e:
            report.mismatches.append(Mismatch(file, f"unreadable shard: {e}"))
            return report
        with f:
            for name in f.matrix_names + f.dense_names:
                report.tensors += 1
                seen.add(name)
                is_matrix = name in f.header.matrices
                try:
                    t = f.matrix(name).to_bf16() if is_matrix else f.tensor(name)
                except W12Error as e:
                    report.mismatches.append(Mismatch(name, f"corrupt: {e}"))
                else:
                    report.matrices += is_matrix
                    m = _compare(name, t, f, orig, cast, is_matrix)
                    if m:
                        report.mismatches.append(m)
                if report.mismatches and stop_at_first:
                    return report
    if orig is not None:
        for name in sorted(set(orig) - seen):
            report.mismatches.append(Mismatch(name, "in the original checkpoint but not in the W12 checkpoint"))
            break
    return report


def _compare(name, t, f, orig, cast, is_matrix):
    if orig is None:
        want = f.header.matrices[name].sha256 if is_matrix else f.header.dense_sha256.get(name)
        if want is None:
            return Mismatch(name, "no stored sha256 to check against; pass the ORIGINAL checkpoint")
        return None if hash_tensor(t) == want else Mismatch(name, "decoded bytes do not match the stored sha256")
    if name not in orig:
        return Mismatch(name, "not in the original checkpoint")
    with safe_open(orig[name], framework="pt") as g:
        o = g.get_tensor(name)
    if is_matrix and cast and o.dtype != torch.bfloat16:
        o = o.to(torch.bfloat16)
    if o.dtype != t.dtype:
        return Mismatch(name, f"dtype {t.dtype}, original {o.dtype}")
    where = first_difference(bits(t), bits(o))
    if where is None:
        return None
    if where == "shape":
        return Mismatch(name, f"shape {list(t.shape)}, original {list(o.shape)}")
    row, col = where if len(where) == 2 else (where[0], None)
    got, exp = bits(t).reshape(t.shape[0] if t.dim() else 1, -1)[row, col or 0], \
        bits(o).reshape(o.shape[0] if o.dim() else 1, -1)[row, col or 0]
    return Mismatch(name, f"bits 0x{int(got) & 0xFFFF:04x}, original 0x{int(exp) & 0xFFFF:04x}", row, col)


def inspect(folder: str | Path) -> dict:
    """Per tensor: shape, bits/weight, escape rate, bytes as BF16 and as stored; totals. Headers only."""
    folder, files, _ = w12_files(folder)
    rows = []
    for file in files:
        with W12File(folder / file) as f:
            for name, info in f.header.matrices.items():
                n, k = info.shape
                nnz = f.dense_layout(companion_names(name)["escapes"])[1][0]
                stored = sum(_nbytes(*f.dense_layout(t)) for t in companion_names(name).values())
                rows.append({"name": name, "shape": [n, k], "kind": "w12", "bytes_bf16": 2 * n * k,
                             "bytes_w12": stored, "escapes": nnz, "escape_rate": nnz / (n * k),
                             "bits_per_weight": 8 * stored / (n * k)})
            for name in f.dense_names:
                dtype, shape = f.dense_layout(name)
                b = _nbytes(dtype, shape)
                rows.append({"name": name, "shape": list(shape), "kind": "dense", "dtype": dtype,
                             "bytes_bf16": b, "bytes_w12": b})
    mats = [r for r in rows if r["kind"] == "w12"]
    weights = sum(r["shape"][0] * r["shape"][1] for r in mats)
    totals = {
        "num_tensors": len(rows), "matrices": len(mats), "weights_converted": weights,
        "bytes_bf16": sum(r["bytes_bf16"] for r in rows), "bytes_w12": sum(r["bytes_w12"] for r in rows),
        "bits_per_weight": 8 * sum(r["bytes_w12"] for r in mats) / weights if weights else None,
        "escape_rate": sum(r["escapes"] for r in mats) / weights if weights else None,
    }
    totals["ratio"] = totals["bytes_w12"] / totals["bytes_bf16"] if totals["bytes_bf16"] else None
    return {"tensors": rows, **totals}


def _nbytes(dtype: str, shape) -> int:
    from .convert import ITEMSIZE

    n = ITEMSIZE.get(dtype, 1)
    for d in shape:
        n *= d
    return n


def decode(folder: str | Path, out: str | Path, progress: bool = False) -> Path:
    """Write the plain BF16 checkpoint back: every tensor byte-identical to the converted source."""
    folder, files, config = w12_files(folder)
    out = Path(out).expanduser()
    if out.exists() and any(out.iterdir()):
        raise OutputExistsError(f"output folder {out} is not empty; choose an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    from tqdm.auto import tqdm

    for file in tqdm(files, desc="decoding", unit="shard", disable=not progress):
        with W12File(folder / file) as f:
            tensors = {name: f.matrix(name).to_bf16() for name in f.matrix_names}
            tensors.update({name: f.tensor(name) for name in f.dense_names})
        tmp = out / (file + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.replace(out / file)
        weight_map.update({n: file for n in tensors})
    for rel in other_files(folder, files):
        if rel not in ("config.json", "w12_convert.json"):
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / rel, out / rel)
    if (folder / INDEX).exists():
        _write_json(out / INDEX, {"metadata": {"total_size": sum((out / f).stat().st_size for f in files)},
                                  "weight_map": dict(sorted(weight_map.items()))})
    config.pop("quantization_config", None)
    _write_json(out / "config.json", config)
    return out
