"""The CUDA kernels' host side on the CPU: config choice, the table override, and (where nvcc exists) that
every kernels/*.cu file compiles for sm_90a and exports its launchers. The kernels themselves are checked
against the reference on the GPU by bench/kernels.py and bench/lm_head.py."""

import ctypes
import shutil

import pytest
import torch

from w12.kernels import cuda_build
from w12.kernels import gemm_cuda as gc


def test_table_hit_and_rule():
    assert gc.pick_config(1, 4096, 4096) == gc.TABLE[(4096, 4096, 8, False)]
    # not in the table: 8 warps for a small grid, K split until >= 2 CTAs per SM
    c = gc.pick_config(1, 512, 8192)
    assert (c.nt, c.warps, c.unroll) == (1, 8, 1) and c.split == 4
    big = gc.pick_config(3, 999 * 128, 4096)
    assert big.warps == 4 and big.split == 1 and big.nt == 1
    assert gc.pick_config(40, 999 * 128, 4096).nt == 8


def test_table_override(tmp_path, monkeypatch):
    p = tmp_path / "t.py"
    p.write_text("TABLE = {\n    (777, 64, 8, False): CudaConfig(1, 4, 2, 1),\n}\n")
    monkeypatch.setenv("W12_CUDA_TABLE", str(p))
    saved = dict(gc.TABLE)
    try:
        gc._load_override()
        assert gc.pick_config(1, 777, 64) == gc.CudaConfig(1, 4, 2, 1)
    finally:
        gc.TABLE.clear()
        gc.TABLE.update(saved)


def test_not_usable_on_cpu():
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    rec = torch.zeros(1, 1, 12288, dtype=torch.uint8)
    assert not gc.usable(x, rec)


def test_load_without_gpu_returns_none(monkeypatch):
    monkeypatch.setenv("W12_CUDA", "auto")
    cuda_build._LIBS.pop("w12_gemv", None)
    with pytest.warns(UserWarning, match="unavailable"):
        assert cuda_build.load("w12_gemv") is None
    cuda_build._LIBS.pop("w12_gemv", None)


@pytest.mark.skipif(cuda_build.nvcc_path() is None or shutil.which("nm") is None, reason="needs nvcc and nm")
@pytest.mark.parametrize("name,symbols", [("w12_gemv", ["w12_gemv"]),
                                          ("lm_head_int8", ["w12_lmh_certified", "w12_lmh_exact_logits"])])
def test_cu_compiles(tmp_path, name, symbols):
    lib = cuda_build.build(name, out_dir=tmp_path)
    assert lib.exists() and cuda_build.build(name, out_dir=tmp_path) == lib  # cached by content
    import subprocess

    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    for s in symbols:
        assert f" T {s}" in out, f"{s} not exported by {lib.name}"
    ctypes.CDLL(str(lib))  # loads (static CUDA runtime, no GPU needed to load)
