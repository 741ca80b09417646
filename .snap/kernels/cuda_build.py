"""Build and load the CUDA C++ kernels (`kernels/*.cu`) on the machine that runs them.

    lib = cuda_build.load("w12_gemv")      # ctypes.CDLL, or None when no CUDA toolchain / GPU is usable

Each `.cu` file is a plain CUDA translation unit with `extern "C"` launchers that take raw device
pointers and a `cudaStream_t` (torch's current stream), so no torch headers and no pybind: nvcc builds a
file in seconds.  The shared library is linked against the static CUDA runtime and cached under
`$W12_CACHE/kernels` (default ~/.cache/w12/kernels), keyed by the SHA-256 of the source, the nvcc
version and the target, so an edited kernel rebuilds and an unchanged one loads at once.

`W12_CUDA=0` disables the CUDA kernels (the Triton kernels run instead); `W12_NVCC` picks the compiler
(default: `$CUDA_HOME/bin/nvcc`, then `nvcc` on PATH).  Failures to build are not silent: `load` raises
`CudaBuildError` with nvcc's output when `W12_CUDA=1` demands the kernels, and otherwise returns None
after one warning.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARCH = "-gencode=arch=compute_90a,code=sm_90a"  # Hopper (H100/H200): the only target the tables were tuned on
FLAGS = [ARCH, "-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "-shared", "-Xcompiler", "-fPIC", "-cudart",
         "static"]
_LIBS: dict = {}


class CudaBuildError(RuntimeError):
    """nvcc is missing or failed; the message holds its command line and output."""


def cache_dir() -> Path:
    root = os.environ.get("W12_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "w12")
    return Path(root) / "kernels"


def nvcc_path() -> str | None:
    if os.environ.get("W12_NVCC"):
        return os.environ["W12_NVCC"]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cand = Path(home) / "bin" / "nvcc"
    return str(cand) if cand.exists() else shutil.which("nvcc")


def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]


def build(name: str, out_dir: Path | None = None) -> Path:
    """Compile kernels/<name>.cu into a cached shared library; returns its path. Raises CudaBuildError."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise CudaBuildError("nvcc not found: set CUDA_HOME or W12_NVCC, or W12_CUDA=0 to use the Triton kernels")
    src = HERE / f"{name}.cu"
    text = src.read_bytes()
    key = hashlib.sha256(text + _nvcc_version(nvcc).encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
    out_dir = out_dir or cache_dir()
    lib = out_dir / f"{name}-{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [nvcc, *FLAGS, "-o", tmp, str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        os.unlink(tmp)
        raise CudaBuildError(f"nvcc failed ({' '.join(cmd)}):\n{res.stdout}{res.stderr}")
    os.replace(tmp, lib)  # atomic: a concurrent build or a crash never leaves half a library
    return lib


def load(name: str):
    """ctypes.CDLL of kernels/<name>.cu built for this machine, or None when CUDA kernels are unavailable."""
    if name in _LIBS:
        return _LIBS[name]
    mode = os.environ.get("W12_CUDA", "auto")
    lib = None
    if mode != "0":
        try:
            import torch

            if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
                raise CudaBuildError("needs a Hopper GPU (compute capability 9.0)")
            lib = ctypes.CDLL(str(build(name)))
        except (CudaBuildError, OSError, subprocess.CalledProcessError) as e:
            if mode == "1":
                raise CudaBuildError(str(e)) from e
            warnings.warn(f"w12: CUDA kernels '{name}' unavailable, using Triton: {str(e)[:400]}", stacklevel=2)
    _LIBS[name] = lib
    return lib
