"""Projection groups: sibling `W12Linear` layers that read the same input run ONE W12 GEMM.

A Llama-style decoder layer calls q, k, v (and gate, up) on the same tensor. Each W12 GEMM call has a fixed
cost, and torch.compile does not merge repeated custom-op calls, so `fuse_projections(model)` turns each
such sibling set into a stateful group:

    parent.q_proj, parent.k_proj, parent.v_proj  ->  records [NB_q + NB_k + NB_v, KB, 12288], ...

* Storage: the leader (first member: q_proj, gate_proj) holds the fused matrix as non-persistent buffers:
  `_fused_packed` (records + the kernels' tables in one int32 tensor, `w12.kernels.ops.pack_matrix`: the
  one tensor its compiled GEMM reads) and `_fused_exponents`, `_fused_esc_counts`, `_fused_escapes`; every
  member's own four buffers become views (dim-0 slices) of them, records into `_fused_packed`, so the W12
  bytes live once. Each member keeps its own small escape tables (`prepare_tables`) for the fallback.
  `state_dict()` gives each member's own (view) tensors; the quantizer saves contiguous copies of them
  (safetensors refuses shared storage).
* Forward (`w12_linear.fused_forward`): the leader runs the fused GEMM and stashes (input, output) under its
  group's id; a later member called with the SAME input tensor object returns its slice of the stashed
  output (+ its own bias); the last member clears the stash. Members read only their `w12_slot` (plain
  ints): a compiled model re-checks on every call whatever its layers read. Anything else (a member
  called first, another input, the 8-bit view, a non-bf16 input, the CPU decode path, unprepared tables)
  runs the member's own GEMM on its view buffers, so correctness never depends on call order.
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

import itertools
import os

import torch
from torch import nn

from w12.formats.layout import TN

from .w12_linear import _STASH, BUFFER_NAMES, PREPARED_NAMES, W12Linear, gemm_device, kernel_backend, packed_matrix

# sibling names per parent module, in call order (Llama, Mistral, Qwen2/3): first = leader, last clears
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
FUSED_NAMES = ("_fused_packed", "_fused_exponents", "_fused_esc_counts", "_fused_escapes")  # BUFFER_NAMES' storage


_GROUP_IDS = itertools.count(1)


class ProjectionGroup:
    """One fused sibling set: members (call order) and their output column bounds. Forward reads none of it:
    each member carries `w12_slot` = (group id, index, first column, end column, last index, fused N, fused
    nnz), plain ints, because a compiled model re-checks every attribute its layers read on every call (a
    shared object reached from two members costs an identity check in Python per member)."""

    def __init__(self, members):
        self.members = tuple(members)
        bounds = [0]
        for m in self.members:
            bounds.append(bounds[-1] + m.out_features)
        self.bounds = tuple(bounds)  # member i owns output columns [bounds[i], bounds[i+1])
        self.nnz = sum(int(m.weight_escapes.shape[0]) for m in self.members)  # the fused matrix's escapes
        self.id = next(_GROUP_IDS)

    def slot(self, i: int) -> tuple:
        last = len(self.members) - 1
        return (self.id, i, self.bounds[i], self.bounds[i + 1], last, self.bounds[-1], self.nnz)


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
                and "_w12_packed" in m._buffers for m in members)
            and gemm_device(first.weight.device))


def fuse_group(members) -> ProjectionGroup:
    """Concatenate the members' W12 tensors on their device, re-point every member at its slice (its own
    packed copy goes; it keeps small escape tables of its own for the fallback)."""
    leader = members[0]
    fused = [torch.cat([getattr(m, name) for m in members]) for name in BUFFER_NAMES]
    packed, fused[0] = packed_matrix(*fused)
    for name, t in zip(FUSED_NAMES, (packed, *fused[1:])):
        leader.register_buffer(name, t, persistent=False)
    starts = [0, 0, 0, 0]  # dim-0 offset in records (NB), exponents (N), counts (NB), escapes (nnz)
    for m in members:
        for j, name in enumerate(BUFFER_NAMES):
            size = getattr(m, name).shape[0]
            m._buffers[name] = fused[j][starts[j]:starts[j] + size]
            starts[j] += size
        for name in PREPARED_NAMES:
            m._buffers.pop(name, None)
        m.prepare_tables()
    group = ProjectionGroup(members)
    for i, m in enumerate(members):
        m.w12_group, m.w12_slot = group, group.slot(i)
    return group


def dissolve(module: W12Linear) -> None:
    """Drop `module`'s group (if any): members keep their (view) buffers and own tables; the leader's
    fused buffers go."""
    group = getattr(module, "w12_group", None)
    if group is None:
        return
    for m in group.members:
        m.w12_group, m.w12_slot = None, None
    _STASH.pop(group.id, None)
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
               and getattr(m, "w12_group", None) is not None and m.w12_group.members[0] is m)


def unshared_state_dict(model: nn.Module, state_dict: dict) -> dict:
    """`state_dict` with every W12 tensor that is a view into a larger storage (grouped members' slices, a
    prepared layer's records inside its `_w12_packed`) replaced by a contiguous CPU copy: safetensors and
    Transformers' save refuse shared storage (CPU: the writer reads them there)."""
    out = dict(state_dict)
    for name, m in model.named_modules():
        if isinstance(m, W12Linear):
            for b in BUFFER_NAMES:
                key = f"{name}.{b}" if name else b
                t = out.get(key)
                if t is not None and t.untyped_storage().nbytes() != t.numel() * t.element_size():
                    out[key] = t.to("cpu", copy=True).contiguous()
    return out
