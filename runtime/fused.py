"""Projection groups: sibling `W12Linear` layers that read the same input run ONE W12 GEMM.

A Llama-style decoder layer calls q, k, v (and gate, up) on the same tensor. Each W12 GEMM call has a fixed
cost, and torch.compile does not merge repeated custom-op calls, so `fuse_projections(model)` turns each
such sibling set into a stateful group:

    parent.q_proj, parent.k_proj, parent.v_proj  ->  records [NB_q + NB_k + NB_v, KB, 12288], ...

* Storage: the leader (first member: q_proj, gate_proj) holds the fused matrix's four tensors as
  non-persistent buffers `_fused_*` plus its prepared escape tables; every member's own four buffers
  become views (dim-0 slices) of them, so the W12 bytes live once. Each member keeps its own small
  escape tables for the fallback. `state_dict()` gives each member's own (view) tensors; the quantizer
  saves contiguous copies of them (safetensors refuses shared storage).
* Forward: the leader runs the fused GEMM and stashes (input, output) on the group; a later member called
  with the SAME input tensor object returns its slice of the stashed output (+ its own bias); the last
  member clears the stash. Anything else (a member called first, another input, the 8-bit view, a
  non-bf16 input, the CPU decode path, unprepared tables) runs the member's own GEMM on its view buffers,
  so correctness never depends on call order.
* Bits: every channel is a dot product with the exact weights either way. On the CPU (the reference op)
  a channel's bits do not depend on the GEMM's width (tested). On CUDA the kernel choice and its split-K /
  warps per CTA depend on N (kernels/gemm_cuda.py `kernel_for`, `pick_config`), so the fused width may add a
  channel's fp32 partials in another (fixed, deterministic) order than the member's own width: possibly
  another last bit than the unfused layer, never another weight.

Why the concatenation is exact (SPEC.md §3, §5, §6): windows are per row; when every member has N a
multiple of TN = 128, records tile whole rows of one member only, so records, exponents and counts
concatenate along dim 0 (N_PAD = N: no padded rows in between); escape lists are in record order
(nb, kb) row-major, and member m's records follow member m−1's, so the escape lists concatenate in
member order. The result is exactly `W12Matrix.from_bf16(torch.cat(member weights))`.

`w12.runtime.prepare(model)` fuses by default on CUDA (`fuse=False` or env `W12_FUSE=0` keep 7 GEMMs per
layer); on the CPU only while `set_cpu_gemm_op(True)` routes CPU layers through the GEMM op (tests).
Moving a fused model (`.to(...)`) copies views apart (memory doubles, results stay exact): call
`prepare(model)` again afterwards.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from w12.formats.layout import TN

from .w12_linear import BUFFER_NAMES, W12Linear, gemm_device, gemm_rows, kernel_backend, prepared_tables

# sibling names per parent module, in call order (Llama, Mistral, Qwen2/3): first = leader, last clears
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
FUSED_NAMES = ("_fused_weight", "_fused_exponents", "_fused_esc_counts", "_fused_escapes", "_fused_tables")


class ProjectionGroup:
    """State of one fused sibling set: members (call order), output column offsets, and the stash."""

    def __init__(self, members):
        self.members = tuple(members)
        bounds = [0]
        for m in self.members:
            bounds.append(bounds[-1] + m.out_features)
        self.bounds = tuple(bounds)  # member i owns output columns [bounds[i], bounds[i+1])
        self.last = len(self.members) - 1  # the member that clears the stash
        self.nnz = sum(int(m.weight_escapes.shape[0]) for m in self.members)  # the fused matrix's escapes
        self.x = None  # the input of the leader's last call (identity, not value, is compared)
        self.y = None  # the fused output [..., N_total] of that call

    def forward(self, x: torch.Tensor, module: W12Linear, i: int):
        """Member i's output from the fused GEMM, or None: the caller runs the member's own GEMM."""
        if i == 0:
            self.x = self.y = None
            if not _fused_ready(module, x):
                return None
            y = gemm_rows(x, module._fused_weight, module._fused_tables, self.bounds[-1], self.nnz)
            self.x, self.y = x, y
        elif self.x is not x:
            return None
        y = self.y[..., self.bounds[i]:self.bounds[i + 1]]
        if i == self.last:
            self.x = self.y = None
        bias = module.bias
        return y + bias if bias is not None else y


def _fused_ready(leader: W12Linear, x: torch.Tensor) -> bool:
    t = leader._buffers.get("_fused_tables")
    return t is not None and t.device == x.device and x.dtype == torch.bfloat16 and gemm_device(x.device)


# ---------------------------------------------------------------------------------------------
# Fusing and dissolving
# ---------------------------------------------------------------------------------------------
def fuse_enabled(fuse: bool | None = None) -> bool:
    """`fuse` if given, else env W12_FUSE ("1"/unset: on, "0": off)."""
    if fuse is not None:
        return bool(fuse)
    value = os.environ.get("W12_FUSE", "1")
    if value not in ("0", "1"):
        raise ValueError(f"W12_FUSE must be 0 or 1, found {value!r}")
    return value == "1"


def fusable(members) -> bool:
    """Same input width and device, a device where the GEMM op runs, prepared, N a multiple of 128 each,
    not already grouped, no accelerate hook (it may swap buffers per call)."""
    if not all(isinstance(m, W12Linear) for m in members) or len({id(m) for m in members}) != len(members):
        return False
    first = members[0]
    return (all(m.in_features == first.in_features and m.weight.device == first.weight.device
                and m.out_features % TN == 0 and getattr(m, "w12_group", None) is None and not hasattr(m, "_hf_hook")
                and "_w12_tables" in m._buffers for m in members)
            and gemm_device(first.weight.device))


def fuse_group(members) -> ProjectionGroup:
    """Concatenate the members' W12 tensors on their device, re-point every member at its slice."""
    leader = members[0]
    fused = [torch.cat([getattr(m, name) for m in members]) for name in BUFFER_NAMES]
    tables = prepared_tables(fused[2], fused[3], fused[1])
    for name, t in zip(FUSED_NAMES, (*fused, tables)):
        leader.register_buffer(name, t, persistent=False)
    starts = [0, 0, 0, 0]  # dim-0 offset in records (NB), exponents (N), counts (NB), escapes (nnz)
    for m in members:
        for j, name in enumerate(BUFFER_NAMES):
            size = getattr(m, name).shape[0]
            m._buffers[name] = fused[j][starts[j]:starts[j] + size]
            starts[j] += size
    group = ProjectionGroup(members)
    for i, m in enumerate(members):
        m.w12_group, m.w12_group_index = group, i
    return group


def dissolve(module: W12Linear) -> None:
    """Drop `module`'s group (if any): members keep their (view) buffers and own tables; the leader's
    fused buffers go."""
    group = getattr(module, "w12_group", None)
    if group is None:
        return
    for m in group.members:
        m.w12_group, m.w12_group_index = None, 0
    for name in FUSED_NAMES:
        group.members[0]._buffers.pop(name, None)


def fuse_projections(model: nn.Module) -> int:
    """Fuse every sibling set of GROUPS that `fusable` accepts (members must be prepared). Returns the
    number of groups made. Needs the GEMM op (w12.kernels); without it nothing is fused."""
    if kernel_backend() is None:
        return 0
    made = 0
    for parent in list(model.modules()):
        for names in GROUPS:
            members = [parent._modules.get(n) for n in names]
            if fusable(members):
                fuse_group(members)
                made += 1
    return made


def unfuse_projections(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, W12Linear):
            dissolve(m)


def fused_groups(model: nn.Module) -> int:
    """Number of projection groups in `model`."""
    return sum(1 for m in model.modules() if isinstance(m, W12Linear)
               and getattr(m, "w12_group", None) is not None and m.w12_group_index == 0)


def unshared_state_dict(model: nn.Module, state_dict: dict) -> dict:
    """`state_dict` with each grouped member's four tensors replaced by a contiguous CPU copy (the views
    share one storage, which safetensors and Transformers' save refuse; CPU: the writer reads them there)."""
    out = dict(state_dict)
    for name, m in model.named_modules():
        if isinstance(m, W12Linear) and getattr(m, "w12_group", None) is not None:
            for b in BUFFER_NAMES:
                key = f"{name}.{b}" if name else b
                if key in out:
                    out[key] = out[key].to("cpu", copy=True).contiguous()
    return out
