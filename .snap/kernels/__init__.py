"""kernels layer of W12 (see ../SPEC.md and the project README).

gemm.py: the fused Triton GEMM (W12 and 8-bit view), its config table and launcher; ops.py: the torch
custom ops `torch.ops.w12.gemm` / `torch.ops.w12.view_gemm`; reference.py: the CPU fallback.
gdn_path_triton.py: Gated DeltaNet tree verification (every draft-tree node's output recomputed along its root
path, recurrent and WY kernels, no per-node state stored), used by specdec/gdn_tree.py.
Import `w12.kernels.ops` to register the ops.
"""
