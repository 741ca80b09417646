"""Fused W12 GEMM kernels through the Triton CPU interpreter (portable decode path, UPCAST), against the
reference decoder + fp32 matmul. Small shapes, big blocks; shapes that are not tile multiples; escapes."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from w12.formats import reference as fmt  # noqa: E402
from w12.kernels import decode as dec  # noqa: E402
from w12.kernels import gemm as g  # noqa: E402
from w12.kernels import ops  # noqa: E402
from w12.kernels import reference as kref  # noqa: E402

pytestmark = pytest.mark.skipif(not g.INTERPRET, reason="kernel module was imported without TRITON_INTERPRET=1")


def make_weight(n, k, seed=0):
    """randn·0.02 in bf16 with escapes: zeros, −0, a denormal, big and tiny values outside the window."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    flat = w.view(-1)
    idx = torch.randperm(n * k, generator=gen)[:40]
    specials = torch.tensor([0.0, -0.0, 1e-39, 100.0, -3.0e4, 1e-9, 0.0, -1e-12], dtype=torch.bfloat16)
    flat[idx] = specials.repeat(5)
    return w


def encode(w):
    records, exps, counts, escapes = fmt.encode(w.view(torch.int16))
    offs, cols = g.prepare_escapes(counts, escapes)
    return records, exps, counts, escapes, offs, cols


def rel_err(y, ref):
    return ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


@pytest.fixture(scope="module")
def mat():
    n, k = 200, 200  # 2 × 4 tiles, neither a multiple of the tile
    w = make_weight(n, k)
    enc = encode(w)
    assert enc[2].sum() > 0, "the test matrix must have escapes"
    return n, k, w, enc


@pytest.mark.parametrize("m,bm,split", [(1, 1, 1), (1, 1, 2), (3, 16, 1), (20, 32, 2), (40, 32, 1)])
def test_w12_gemm_matches_reference(mat, m, bm, split):
    n, k, w, (records, exps, counts, escapes, offs, cols) = mat
    x = torch.randn(m, k).to(torch.bfloat16)
    ref = kref.gemm(x, records, exps, counts, escapes, n)
    assert torch.equal(ref, (x.float() @ w.float().t()).to(torch.bfloat16))  # decode is lossless
    cfg = g.Config(bm=bm, split=split)
    y = g.launch(x, records, exps, n, escapes, offs, cols, config=cfg)
    assert rel_err(y, ref) < 4e-3
    # every output within one bf16 rounding of the fp32 reference
    r32 = x.float() @ w.float().t()
    assert ((y.float() - r32).abs() <= r32.abs() * 2**-8 + 1e-6 * r32.abs().max()).all()
    if split > 1:  # ticket reset: a second run gives the same bits
        assert torch.equal(y, g.launch(x, records, exps, n, escapes, offs, cols, config=cfg))


@pytest.mark.parametrize("m,bm,split", [(1, 1, 1), (5, 16, 2)])
def test_view_gemm_matches_reference(mat, m, bm, split):
    n, k, w, (records, exps, counts, escapes, offs, cols) = mat
    x = torch.randn(m, k).to(torch.bfloat16)
    ref = kref.gemm(x, records, exps, counts, escapes, n, view=True)
    y = g.launch(x, records, exps, n, view=True, config=g.Config(bm=bm, split=split))
    assert rel_err(y, ref) < 4e-3


def test_identity_decodes_every_weight_exactly():
    """x = I: y = Wᵀ; in-window weights come out bit-exact (fp32 sum of one product), escapes within rounding."""
    n, k = 130, 96
    w = make_weight(n, k, seed=1)
    records, exps, counts, escapes, offs, cols = encode(w)
    x = torch.eye(k).to(torch.bfloat16)
    y = g.launch(x, records, exps, n, escapes, offs, cols, config=g.Config(bm=128, split=1))
    rows, cl = fmt.escape_coordinates(counts, escapes)
    esc = torch.zeros(n, k, dtype=torch.bool)
    esc[rows, cl] = True
    yt = y.t()
    assert torch.equal(yt.view(torch.int16)[~esc], w.view(torch.int16)[~esc])
    assert torch.allclose(yt[esc].float(), w[esc].float(), atol=1e-6, rtol=2**-8)


def test_decode_kernel_gives_every_bit(mat):
    """kernels/decode.py (the M > LARGE_M path): W bit for bit, escapes patched; the view as the reference has it."""
    n, k, w, (records, exps, counts, escapes, offs, cols) = mat
    assert torch.equal(dec.decode(records, exps, escapes, offs, n, k).view(torch.int16), w.view(torch.int16))
    view = dec.decode(records, exps, None, None, n, k, view=True).view(torch.int16)
    assert torch.equal(view, fmt.decode(records, exps, counts, escapes, n, k, lo_fill=8))
    with pytest.raises(ValueError, match="needs escapes"):
        dec.decode(records, exps, None, None, n, k)


def test_decode_kernel_patches_more_escapes_than_one_step():
    """Two zero rows: 128 escapes in each record of the first record row, more than one EB step of the patch loop;
    and a matrix without any escape."""
    n, k = 130, 128
    w = make_weight(n, k, seed=3)
    w[5] = 0.0
    w[6] = -0.0
    records, exps, counts, escapes, offs, cols = encode(w)
    assert counts.max() > dec.EB
    for rows in (128, 32):  # a record per program, or a quarter of one (each patches the escapes of its rows)
        got = dec.decode(records, exps, escapes, offs, n, k, rows=rows)
        assert torch.equal(got.view(torch.int16), w.view(torch.int16))
    gen = torch.Generator().manual_seed(4)
    sign = torch.randint(0, 2, (64, 64), generator=gen) * 2 - 1
    plain = ((torch.rand(64, 64, generator=gen) + 1) * sign).to(torch.bfloat16)  # |w| in [1, 2]: all in window
    records, exps, counts, escapes, offs, cols = encode(plain)
    assert escapes.shape[0] == 0
    assert torch.equal(dec.decode(records, exps, escapes, offs, 64, 64), plain)


def test_ops_cpu_fallback_and_fake(mat):
    n, k, w, (records, exps, counts, escapes, offs, cols) = mat
    x = torch.randn(2, 3, k).to(torch.bfloat16)
    y = ops.matmul(x, records, exps, escapes, offs, cols, n)
    assert y.shape == (2, 3, n)
    assert torch.equal(y.reshape(6, n), kref.gemm(x.reshape(6, k), records, exps, counts, escapes, n))
    yv = ops.matmul(x, records, exps, escapes, offs, cols, n, view=True)
    assert torch.equal(yv.reshape(6, n), kref.gemm(x.reshape(6, k), records, exps, counts, escapes, n, view=True))
    x2 = x.reshape(6, k)
    torch.library.opcheck(torch.ops.w12.gemm.default, (x2, records, exps, escapes, offs, cols, n),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.w12.view_gemm.default, (x2, records, exps, n),
                          test_utils=("test_schema", "test_faketensor"))
    packed = ops.pack_matrix(records, exps, escapes, offs, cols)
    torch.library.opcheck(torch.ops.w12.gemm_packed.default, (x2, packed, n, escapes.shape[0]),
                          test_utils=("test_schema", "test_faketensor"))


def test_pick_config_is_a_pure_table_lookup():
    c = g.pick_config(1, 4096, 4096)
    assert c.bm == 1 and c.split >= 2
    assert g.pick_config(128, 151936, 5120).split == 1


@pytest.mark.parametrize("m,bm,split", [(1, 1, 1), (20, 32, 2)])
def test_kernel_reads_the_packed_tables_views(mat, m, bm, split):
    """What `torch.ops.w12.gemm_packed` hands the kernels (views into one packed int32 tensor, at offsets:
    the tables alone, and records + tables) gives the same bits as the separate tensors."""
    n, k, w, (records, exps, counts, escapes, offs, cols) = mat
    x = torch.randn(m, k).to(torch.bfloat16)
    tables = ops.pack_tables(exps, escapes, offs, cols)
    parts = ops.unpack_tables(tables, records.shape[0], records.shape[1], escapes.shape[0])
    cfg = g.Config(bm=bm, split=split)
    want = g.launch(x, records, exps, n, escapes, offs, cols, config=cfg)
    got = g.launch(x, records, parts[0], n, parts[1], parts[2], parts[3], config=cfg)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    packed = ops.pack_matrix(records, exps, escapes, offs, cols)
    parts = ops.unpack_matrix(packed, records.shape[0], records.shape[1], escapes.shape[0])
    got = g.launch(x, parts[0], parts[1], n, parts[2], parts[3], parts[4], config=cfg)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    ref = ops.w12_gemm_packed(x, packed, n, escapes.shape[0])  # the op's CPU path: the reference
    assert torch.equal(ref, kref.gemm(x, records, exps, counts, escapes, n))
