"""W12 matrices in standard safetensors files (SPEC.md §7, §9).

    write_file(path, dense={"model.norm.weight": t}, matrices={"model.layers.0.mlp.up_proj.weight": m})
    with W12File(path) as f:
        for name in f.matrix_names: m = f.matrix(name)        # validated W12Matrix
        for name in f.dense_names:  t = f.tensor(name)

The header is read and checked (rules 1–4 of §9) before any tensor data; each matrix is validated in
full (rules 4–9) when it is loaded. Every failure is a `W12Error` subclass, never a parser's own error.
"""

import json
import os
from dataclasses import dataclass, field

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .errors import ContainerError, DiskFullError, HeaderError, MissingTensorError, ShapeError, TensorLayoutError, VersionError, W12Error
from .layout import (
    COMPANION_SUFFIXES,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEADER_KEY,
    MAX_DIM,
    REC_BYTES,
    companion_names,
    padded,
    tiles,
)
from .matrix import W12Matrix

MAX_HEADER_CHARS = 64 * 1024 * 1024  # a W12 header larger than this is refused before JSON parsing


@dataclass
class MatrixInfo:
    shape: tuple[int, int]
    sha256: str | None = None


@dataclass
class Header:
    version: int
    matrices: dict[str, MatrixInfo] = field(default_factory=dict)
    dense_sha256: dict[str, str] = field(default_factory=dict)  # tensors stored unchanged -> sha256

    def to_json(self) -> str:
        mats = {name: {"shape": list(info.shape), **({"sha256": info.sha256} if info.sha256 else {})}
                for name, info in self.matrices.items()}
        obj = {"format": FORMAT_NAME, "version": self.version, "matrices": mats}
        if self.dense_sha256:
            obj["dense"] = {name: {"sha256": sha} for name, sha in self.dense_sha256.items()}
        return json.dumps(obj, sort_keys=True)


def _check_sha(what: str, sha) -> None:
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
        raise HeaderError(f"{what}: sha256 must be 64 hex characters, found {sha!r}")


def parse_header(metadata: dict | None) -> Header:
    """The W12 header from a safetensors metadata dict (SPEC.md §7, §9 rules 1–2)."""
    text = (metadata or {}).get(HEADER_KEY)
    if text is None:
        raise HeaderError(f"no '{HEADER_KEY}' key in the safetensors metadata: this is not a W12 file "
                          "(convert the checkpoint with `w12 convert` first)")
    if len(text) > MAX_HEADER_CHARS:
        raise HeaderError(f"the '{HEADER_KEY}' header is {len(text)} characters, more than {MAX_HEADER_CHARS}")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise HeaderError(f"the '{HEADER_KEY}' header is not valid JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        found = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise HeaderError(f"the '{HEADER_KEY}' header must be an object with format '{FORMAT_NAME}', found {found!r}")
    version = obj.get("version")
    if version != FORMAT_VERSION:
        raise VersionError(f"this reader implements W12 format version {FORMAT_VERSION}, the file has version "
                           f"{version!r}; upgrade w12 to read it")
    mats = obj.get("matrices")
    if not isinstance(mats, dict):
        raise HeaderError(f"the '{HEADER_KEY}' header's 'matrices' must be an object, found {type(mats).__name__}")
    header = Header(version)
    for name, info in mats.items():
        if not isinstance(info, dict):
            raise HeaderError(f"matrix {name!r}: expected an object with 'shape', found {type(info).__name__}")
        shape = info.get("shape")
        if not (isinstance(shape, list) and len(shape) == 2
                and all(type(d) is int and 1 <= d <= MAX_DIM for d in shape)):
            raise ShapeError(f"matrix {name!r}: shape must be two integers in [1, {MAX_DIM}], found {shape!r}")
        sha = info.get("sha256")
        _check_sha(f"matrix {name!r}", sha)
        try:
            companion_names(name)
        except ValueError as e:
            raise HeaderError(f"matrix {name!r}: {e}") from None
        header.matrices[name] = MatrixInfo((shape[0], shape[1]), sha)
    dense = obj.get("dense", {})
    if not isinstance(dense, dict) or not all(isinstance(v, dict) for v in dense.values()):
        raise HeaderError(f"the '{HEADER_KEY}' header's 'dense' must map names to objects, found {dense!r:.80}")
    for name, info in dense.items():
        _check_sha(f"dense tensor {name!r}", info.get("sha256"))
        if info.get("sha256"):
            header.dense_sha256[name] = info["sha256"]
    return header


_ST_DTYPES = {torch.uint8: "U8", torch.int32: "I32", torch.int16: "I16"}


def expected_layout(info: MatrixInfo) -> dict[str, tuple[str, tuple | None]]:
    """Role -> (safetensors dtype, shape) of the four tensors (escapes' first dim is data-dependent)."""
    n, k = info.shape
    nb, kb = tiles(n, k)
    return {"records": ("U8", (nb, kb, REC_BYTES)), "exponents": ("U8", (padded(n, k)[0],)),
            "counts": ("I32", (nb, kb)), "escapes": ("I16", None)}


class W12File:
    """A safetensors file holding W12 matrices and dense tensors, opened for reading."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            self._f = safe_open(self.path, framework="pt", device="cpu")
            self._f.__enter__()
            metadata = self._f.metadata()
            self._layout = {name: (self._f.get_slice(name).get_dtype(), tuple(self._f.get_slice(name).get_shape()))
                            for name in self._f.keys()}
        except W12Error:
            raise
        except Exception as e:  # the parser's own errors (corrupt header, short file, bad JSON, ...)
            raise ContainerError(f"{self.path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
        self.header = parse_header(metadata)
        self.metadata = metadata or {}
        self._check_names()

    def _check_names(self) -> None:
        owned = set()
        for name, info in self.header.matrices.items():
            names = companion_names(name)
            for role, (dtype, shape) in expected_layout(info).items():
                t = names[role]
                if t not in self._layout:
                    raise MissingTensorError(f"{self.path}: matrix {name!r} lacks its tensor {t!r}")
                fdtype, fshape = self._layout[t]
                ok = fdtype == dtype and (fshape == shape if shape else len(fshape) == 2 and fshape[1] == 2)
                if not ok:
                    raise TensorLayoutError(f"{self.path}: {t!r} must be {dtype} {list(shape) if shape else '[nnz, 2]'}"
                                            f" for a {info.shape[0]}×{info.shape[1]} matrix, found {fdtype} {list(fshape)}")
                owned.add(t)
        for t in self._layout:
            if t.endswith(COMPANION_SUFFIXES) and t not in owned:
                raise MissingTensorError(f"{self.path}: {t!r} is a W12 tensor, but its matrix is not listed in the "
                                         f"'{HEADER_KEY}' header")
        self._owned = owned

    # ---- access -------------------------------------------------------------------------------
    @property
    def matrix_names(self) -> list[str]:
        return list(self.header.matrices)

    @property
    def dense_names(self) -> list[str]:
        return [t for t in self._layout if t not in self._owned]

    def dense_layout(self, name: str) -> tuple[str, tuple]:
        return self._layout[name]

    def _get(self, name: str) -> torch.Tensor:
        try:
            return self._f.get_tensor(name)
        except Exception as e:
            raise ContainerError(f"{self.path}: cannot read tensor {name!r} ({type(e).__name__}: {e})") from None

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._layout or name in self._owned:
            raise MissingTensorError(f"{self.path}: no dense tensor {name!r}")
        return self._get(name)

    def matrix(self, name: str) -> W12Matrix:
        """The validated W12 matrix stored under `name` ("P.weight")."""
        if name not in self.header.matrices:
            raise MissingTensorError(f"{self.path}: no W12 matrix {name!r}; the file lists {self.matrix_names[:5]}…")
        names = companion_names(name)
        try:
            return W12Matrix(self._get(names["records"]), self._get(names["exponents"]), self._get(names["counts"]),
                             self._get(names["escapes"]), self.header.matrices[name].shape)
        except W12Error as e:
            raise type(e)(f"{self.path}: matrix {name!r}: {e}") from None

    def close(self) -> None:
        self._f.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def matrix_tensors(name: str, m: W12Matrix) -> dict[str, torch.Tensor]:
    """The four tensors stored for matrix `name` ("P.weight"), as SPEC.md §7 names them."""
    names = companion_names(name)
    return {names["records"]: m.records, names["exponents"]: m.exponents, names["counts"]: m.esc_counts,
            names["escapes"]: m.escapes}


def write_file(path: str | os.PathLike, dense: dict[str, torch.Tensor], matrices: dict[str, W12Matrix],
               sha256: dict[str, str] | None = None, metadata: dict[str, str] | None = None) -> None:
    """Write dense tensors and W12 matrices to `path` atomically (temporary file, then rename).
    `sha256` maps matrix or dense tensor names to the SHA-256 of their original bytes (SPEC.md §7)."""
    path = os.fspath(path)
    sha256 = sha256 or {}
    header = Header(FORMAT_VERSION, {name: MatrixInfo(m.shape, sha256.get(name)) for name, m in matrices.items()},
                    {name: sha256[name] for name in dense if name in sha256})
    tensors = {}
    for name, m in matrices.items():
        tensors.update(matrix_tensors(name, m))
    clash = set(tensors) & set(dense)
    if clash:
        raise ContainerError(f"{path}: dense tensors {sorted(clash)[:3]} clash with W12 tensor names")
    tensors.update({k: v.contiguous() for k, v in dense.items()})
    meta = {"format": "pt", **(metadata or {}), HEADER_KEY: header.to_json()}
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        save_file(tensors, tmp, metadata=meta)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # the writer creates 0600 files; give the usual permissions
        os.replace(tmp, path)
    except Exception as e:  # OSError (disk full, permissions) or the writer's own error
        if os.path.exists(tmp):
            os.remove(tmp)
        if getattr(e, "errno", None) == 28 or "No space left" in str(e):
            raise DiskFullError(f"no space left on the device while writing {path}") from None
        raise ContainerError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}") from None
