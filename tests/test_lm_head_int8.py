"""Certified INT8 LM head (kernels/lm_head_int8.py, kernels/lm_head_int8_triton.py): the argmax equals the
exact BF16 head's (torch.argmax of F.linear: first index among equal maxima) on 10^5 hidden vectors with
planted ties and extreme norms; the Triton pass (interpreter) selects the same candidates as the torch
reference; a shrunk bound is caught."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from w12.kernels.lm_head_int8 import CertifiedHead, CertifiedLMHead, gamma

V, K = 2048, 256


def llm_like(v=V, k=K, seed=0):
    """Heavy-tailed rows (Student-t), log-normal row norms, a few outlier columns, planted twins:
    row 2i+1 of the first 64 pairs = row 2i exactly (equal logits: the lower id must win), and the next
    64 pairs differ in one element by one ulp (logits a few ulps apart)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.distributions.StudentT(4.0).sample((v, k)) * 0.02
    w *= torch.exp(0.3 * torch.randn(v, 1, generator=g))
    w[:, :4] *= 8
    w = w.bfloat16()
    w[1:128:2] = w[0:128:2]
    twin = w[128:256:2].clone()
    twin[:, 7] = torch.nextafter(twin[:, 7].float(), torch.tensor(math.inf)).bfloat16()  # ≥ 1 bf16 ulp up
    w[129:256:2] = twin
    if v > 302:
        w[300] = 0  # a zero row
        w[301] *= 2.0 ** 30  # extreme row norms
        w[302] *= 2.0 ** -30
    return w


def hidden(w, n, seed=1):
    """Hidden-state-like vectors: outlier dims, random norms; a quarter aimed at the planted twins."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, K, generator=g) * torch.exp(0.5 * torch.randn(n, 1, generator=g))
    x[:, :4] *= 10
    aim = torch.randint(0, 256, (n // 4,), generator=g)
    x[: n // 4] = 0.5 * x[: n // 4] + 40 * w[aim].float() / w[aim].float().norm(dim=1, keepdim=True)
    return x.bfloat16()


@pytest.fixture(scope="module")
def head():
    return CertifiedHead.from_weight(llm_like())


def test_quantisation_worked_example():
    # s = 1/127 (fp32), q = round(w·127): 127, −63.5 → −64 (half to even), 31.75 → 32, 0
    w = torch.tensor([[1.0, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    h = CertifiedHead.from_weight(w)
    assert h.q.tolist() == [[127, -64, 32, 0], [0, 0, 0, 0]]
    assert h.scale[0].item() == torch.tensor(1 / 127, dtype=torch.float32).item() and h.scale[1] == 0
    e = math.sqrt(sum((a - h.scale[0].item() * b) ** 2 for a, b in zip([1, -0.5, 0.25, 0], [127, -64, 32, 0])))
    assert h.err[0].item() >= e and h.err[0].item() <= e * (1 + 1e-6)
    assert h.err[1] == 0 and h.radius[1] == 0
    assert h.radius[0].item() >= e + gamma(5) * 1.14 + gamma(4) * 1.14  # D ≥ E + γ_{K+1}‖ŵ‖ + γ_K‖w‖


def test_bound_covers_every_row(head):
    # a real-number check of step 3: |w·x − A| ≤ N_x·D_v for every (row, vector), in fp64
    x = hidden(head.weight, 256)
    exact = x.double() @ head.weight.double().T
    a, _, _ = head.bounds(x)
    radius = x.double().norm(dim=1, keepdim=True) * head.radius.double()
    assert ((exact - a.double()).abs() <= radius).all()
    audit = head.check(x)
    assert audit["violations"] == 0 and audit["rows_missed"] == 0 and audit["max_ratio"] < 1


def test_argmax_equals_exact_head_on_1e5_vectors(head):
    w = head.weight
    counts, ties, fallbacks, ambiguous, n = [], 0, 0, 0, 0
    for chunk in range(10):
        x = hidden(w, 10_000, seed=100 + chunk)
        if chunk == 9:  # extreme activation norms: tiny (logits underflow), huge (logits overflow to inf), zero
            x[:1000] = (x[:1000].float() * 2.0 ** -120).bfloat16()
            x[1000:2000] = (x[1000:2000].float() * 2.0 ** 60).bfloat16()
            x[2000:2100] = (x[2000:2100].float() * 2.0 ** 110).bfloat16()
            x[2100:2200] = 0
        exact = F.linear(x, w)
        ref = exact.argmax(1)
        ids, info = head.argmax(x)
        assert torch.equal(ids, ref), f"chunk {chunk}: {int((ids != ref).sum())} argmax differences"
        top = exact.max(1, keepdim=True).values
        ties += int(((exact == top).sum(1) > 1).sum())
        ok = ~info.fallback
        counts.append(info.counts[ok].float())
        fallbacks += int(info.fallback.sum())
        ambiguous += int(info.ambiguous.sum())
        n += x.shape[0]
        if chunk == 9:
            assert info.fallback[2000:2100].all()  # overflowed bounds fall back to the full exact head
            assert (ids[2100:2200] == 0).all()  # all logits 0: the first id wins
    c = torch.cat(counts)
    print(f"\n{n} vectors, V×K = {V}×{K}: survivors/row mean {c.mean():.2f}, max {int(c.max())}, "
          f"exact ties at the top {ties}, ambiguous {ambiguous}, fallback rows {fallbacks}")
    assert ties > 500  # the planted twins did produce exact ties (resolved to the lower id above)
    assert c.mean() < 8


def test_rescoring_matches_full_head_bits(head):
    # step 6 on this backend: gathered-row F.linear gives the full head's bits for the survivors
    x = hidden(head.weight, 512, seed=7)
    full = F.linear(x, head.weight)
    _, info = head.argmax(x)
    valid = info.index >= 0
    got = info.logits[valid].view(torch.int16)
    want = full.gather(1, info.index.clamp(min=0))[valid].view(torch.int16)
    assert torch.equal(got, want)


def test_strict_mode_answers_ambiguous_rows_from_full_head(head):
    x = hidden(head.weight, 512, seed=8)
    ids, info = head.argmax(x, strict=True)
    assert torch.equal(ids, F.linear(x, head.weight).argmax(1))
    assert info.ambiguous.any() and (info.fallback >= info.ambiguous).all()


def test_shrunk_bound_is_caught():
    # pairs of rows w, w + δ whose INT8 copies order differently from the exact weights: x aimed at the pair
    g = torch.Generator().manual_seed(3)
    base = (torch.randn(512, K, generator=g) * 0.02).bfloat16()
    w = base.repeat_interleave(2, 0)
    w[1::2] = (base.float() + 0.002 * torch.randn(512, K, generator=g)).bfloat16()
    h = CertifiedHead.from_weight(w)
    x = (base.float() / base.float().norm(dim=1, keepdim=True) * 30 + 0.3 * torch.randn(512, K, generator=g))
    x = x.bfloat16()
    ref = F.linear(x, w).argmax(1)
    wrong = int((h.argmax(x, shrink=1e-3)[0] != ref).sum())
    audit = h.check(x, shrink=1e-3)
    assert wrong >= 5 and audit["violations"] > 0 and audit["rows_missed"] > 0
    assert torch.equal(h.argmax(x)[0], ref) and h.check(x)["violations"] == 0


@pytest.mark.parametrize("m", [1, 5, 33])
def test_triton_selects_the_reference_candidates(m):
    w = llm_like(1000, K, seed=5)[:, :200].contiguous()  # V, K not multiples of the blocks
    h = CertifiedHead.from_weight(w)
    x = torch.randn(m, 200).bfloat16()
    x[0] = (w[0].float() * 50).bfloat16()  # aimed at the twin pair 0/1
    ids_t, info_t = h.argmax(x, backend="triton")
    ids_r, info_r = h.argmax(x, backend="torch")
    assert torch.equal(ids_t, F.linear(x, w).argmax(1)) and torch.equal(ids_t, ids_r)
    assert torch.equal(info_t.counts, info_r.counts) and torch.equal(info_t.index, info_r.index)


def test_triton_cap_overflow_and_shrink():
    w = llm_like(1000, K, seed=6)
    h = CertifiedHead.from_weight(w)
    x = torch.randn(4, K).bfloat16()
    x[1] = 0  # every row ties: 1000 candidates > cap → full-head fallback
    ids, info = h.argmax(x, backend="triton", cap=16)
    assert torch.equal(ids, F.linear(x, w).argmax(1)) and info.fallback[1] and info.counts[1] == 1000
    _, info0 = h.argmax(x, backend="triton", shrink=0.0)
    assert (info0.counts[[0, 2, 3]] <= info.counts[[0, 2, 3]]).all()


def test_from_w12_equals_from_weight():
    from w12.formats.matrix import W12Matrix

    w = llm_like(300, K, seed=9)
    a, b = CertifiedHead.from_weight(w), CertifiedHead.from_w12(W12Matrix.from_bf16(w))
    for name in ("q", "scale", "radius", "err", "wnorm"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_module_wrapper():
    lin = nn.Linear(K, 700, bias=False).to(torch.bfloat16)
    mod = CertifiedLMHead(lin)
    h = torch.randn(2, 3, K).bfloat16()
    assert torch.equal(mod(h), lin(h))  # forward = the exact head: full logits for sampling / scores
    assert torch.equal(mod.argmax(h), lin(h).argmax(-1)) and mod.last.counts.shape == (6,)
    with pytest.raises(ValueError, match="without bias"):
        CertifiedLMHead(nn.Linear(K, 10).to(torch.bfloat16))
    with pytest.raises(ValueError, match="bf16"):
        CertifiedLMHead(nn.Linear(K, 10, bias=False))


def test_smollm2_tied_embedding_head():
    """The real SmolLM2-135M tied embedding (49152 × 576) as the head, hidden-like vectors."""
    from w12.convert.fixtures import SMOLLM2_DIRNAME, MARKER, cache_dir

    folder = cache_dir() / SMOLLM2_DIRNAME
    if not (folder / MARKER).exists():
        pytest.skip("SmolLM2 fixture not cached (python -m w12.convert.fixtures smollm2)")
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        w = f.get_tensor("model.embed_tokens.weight")
    h = CertifiedHead.from_weight(w)
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(0, w.shape[0], (1024,), generator=g)
    # near a token's own embedding direction plus noise, at the norm of real final hidden states (~10²)
    x = w[tok].float() / w[tok].float().norm(dim=1, keepdim=True) * 60 + 2 * torch.randn(1024, 576, generator=g)
    x = x.bfloat16()
    ids, info = h.argmax(x)
    assert torch.equal(ids, F.linear(x, w).argmax(1))
    print(f"\nSmolLM2 head 49152×576: survivors/row mean {info.counts.float().mean():.2f}, "
          f"max {int(info.counts.max())}, ambiguous {int(info.ambiguous.sum())}/1024")


# ---------------------------------------------------------------------------------------------
# The CUDA path's logic, emulated in torch on the CPU (kernels/lm_head_int8.cu runs on the GPU only,
# checked by bench/lm_head.py): the fixed-order exact head, selection, and the step-6 ambiguity rule.
# ---------------------------------------------------------------------------------------------
def fixed_order(x, w, absolute=False):
    """fp32 z [M, V] in the CUDA order: lane l sums chunks 32j + l (k = 256j + 8l + e) from +0 with one
    rounding per product (products of bf16 are exact in fp32), then the xor butterfly 16, 8, 4, 2, 1."""
    xf, wf = x.float(), w.float()
    if absolute:
        xf, wf = xf.abs(), wf.abs()
    m, k = xf.shape
    lanes = torch.arange(32)
    acc = torch.zeros(m, w.shape[0], 32)
    for j in range((k + 255) // 256):
        live = 256 * j + 8 * lanes < k  # whole chunks (K % 8 == 0)
        for e in range(8):
            kk = (256 * j + 8 * lanes + e).clamp(max=k - 1)
            acc = torch.where(live, acc + xf[:, None, kk] * wf[None, :, kk], acc)
    for o in (16, 8, 4, 2, 1):
        acc = acc + acc[..., lanes ^ o]
    return acc[..., 0]


def reversed_order(x, w):
    """Another legal order: one sequential fp32 sum from the last element to the first."""
    xf, wf = x.float(), w.float()
    acc = torch.zeros(x.shape[0], w.shape[0])
    for i in reversed(range(x.shape[1])):
        acc = acc + xf[:, i, None] * wf[None, :, i]
    return acc


def emulate_cuda(head, x):
    """(ids, ambiguous, counts) as lm_head_int8.cu computes them, the rescoring done by fixed_order."""
    from w12.kernels.lm_head_int8 import ABS_PAD, REL_PAD, _amb_coef

    _, up, lo = head.bounds(x)
    every = ~(torch.isfinite(up).all(1) & torch.isfinite(lo).all(1))
    cand = (up >= lo.amax(1, keepdim=True)) | every[:, None]
    z = fixed_order(x, head.weight)
    s = fixed_order(x, head.weight, absolute=True)
    f = z.bfloat16().float()
    ids = torch.where(cand, f, -math.inf).argmax(1)  # ties: the first index (packed atomicMax of (F, −v))
    d = (torch.tensor(_amb_coef(x.shape[1], head.u_acc)) * s + REL_PAD * z.abs()) + torch.tensor(ABS_PAD)
    lo_c, hi_c = (z - d).bfloat16().float(), (z + d).bfloat16().float()
    lo_a = lo_c.gather(1, ids[:, None])
    col = torch.arange(z.shape[1])[None]
    beats = (hi_c > lo_a) | ((hi_c == lo_a) & (col < ids[:, None]))
    amb = (cand & beats & (col != ids[:, None])).any(1) & ~every
    return ids, amb, cand.sum(1), f


def test_cuda_logic_emulated_g1_and_g2(head):
    """G1: the emulated pipeline's ids == argmax of the fixed-order head, every row.  G2: on rows not
    flagged ambiguous, ids == the argmax of two other summation orders (F.linear on the CPU, reversed)."""
    n_amb = n = 0
    for chunk in range(6):
        x = hidden(head.weight, 256, seed=300 + chunk)
        if chunk == 5:
            x[:8] = 0
            x[8:16] = (x[8:16].float() * 2.0 ** 122).bfloat16()  # ‖x‖ overflows: every row a candidate
        ids, amb, counts, f = emulate_cuda(head, x)
        assert torch.equal(ids, f.argmax(1))  # G1 (step 5 with the fixed-order head as the exact head)
        for other in (F.linear(x, head.weight).float(), reversed_order(x, head.weight).bfloat16().float()):
            ok = ~amb & torch.isfinite(other).all(1)
            assert torch.equal(ids[ok], other.argmax(1)[ok])  # G2
        n_amb += int(amb.sum())
        n += x.shape[0]
    assert n_amb < n // 4  # exact twins are not ambiguous; one-ulp twins and near ties may be
    print(f"\nemulated CUDA logic: {n} vectors, ambiguous {n_amb}")


def test_amb_coef_is_an_upper_bound():
    from w12.kernels.lm_head_int8 import _amb_coef

    for k in (256, 4096, 5120):
        c = _amb_coef(k, 2.0 ** -22)
        assert c >= 2 * gamma(k, 2.0 ** -22) * (1 + gamma(k, 2.0 ** -24)) * (1 + 2.0 ** -16)
        assert torch.tensor(c, dtype=torch.float32).item() == c  # an fp32 value, passed exactly


def test_cuda_backend_refuses_cpu_tensors(head):
    x = hidden(head.weight, 2)
    with pytest.raises(ValueError, match="cuda_certified"):
        head.argmax(x, backend="cuda")
