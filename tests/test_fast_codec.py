"""The numba codec (formats/fast.py) against the torch reference: byte-identical encodings, bit-exact
round trips, the same 8-bit view, and the errors the fast codec raises where the reference has no
checks (it must never read or write out of bounds)."""

import numba
import pytest
import torch

from w12.formats import fast, reference
from w12.formats.errors import EscapeCountError, EscapePositionError, InputError, TensorLayoutError, W12Error
from w12.formats.layout import E_HI, E_LO, REC_BYTES, TK, TN, padded, tiles

SHAPES = [(1, 1), (3, 5), (1, 130), (257, 1), (129, 65), (300, 200), (256, 128), (128, 64), (131, 193)]

# special 16-bit patterns: ±0, smallest/largest denormals, ±inf, quiet/signalling NaNs with payloads,
# largest finite, smallest normal, huge outliers
SPECIALS = [0x0000, 0x8000, 0x0001, 0x007F, 0x8001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x7FFF,
            0xFFFF, 0x7F7F, 0xFF7F, 0x0080, 0x8080, 0x4B00, 0xCB00, 0x6000, 0xE000]


def to_i16(values) -> torch.Tensor:
    """16-bit patterns (ints in [0, 65535]) as int16."""
    t = torch.as_tensor(values, dtype=torch.int32)
    return torch.where(t > 32767, t - 65536, t).to(torch.int16)


def llm_like_bits(n, k, seed, specials=0.02):
    """σ = 0.02 weights in BF16 with a few exact zeros, rare huge outliers, and a fraction of special
    patterns sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    bits = w.view(torch.int16).clone()
    u = torch.rand(n, k, generator=g)
    sp = to_i16(SPECIALS)
    pick = sp[torch.randint(0, len(SPECIALS), (n, k), generator=g)]
    bits = torch.where(u < specials, pick, bits)
    big = (torch.randn(n, k, generator=g) * 300.0).to(torch.bfloat16).view(torch.int16)
    return torch.where((u >= specials) & (u < specials + 0.002), big, bits)


def random_bits(n, k, seed):
    """Uniform random 16-bit patterns: every class (NaN payloads, denormals, ...) all over the range."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-32768, 32768, (n, k), generator=g, dtype=torch.int32).to(torch.int16)


def assert_same_encoding(got, want):
    names = ("records", "exponents", "counts", "escapes")
    for name, a, b in zip(names, got, want):
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} != {b.dtype}"
        assert tuple(a.shape) == tuple(b.shape), f"{name}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.equal(a, b), f"{name} differ"


def check_against_reference(bits, exponents=None):
    n, k = bits.shape
    enc = fast.encode(bits, exponents=exponents)
    ref = reference.encode(bits, exponents=None if exponents is None else exponents[:n])
    assert_same_encoding(enc, ref)
    dec = fast.decode(*enc, n, k)
    assert dec.dtype == torch.int16 and tuple(dec.shape) == (n, k)
    assert torch.equal(dec, bits)
    for fill in (8, 0):
        assert torch.equal(fast.decode(*enc, n, k, lo_fill=fill), reference.decode(*ref, n, k, lo_fill=fill))
    return enc


@pytest.mark.parametrize("shape", SHAPES)
def test_llm_like_with_specials(shape):
    check_against_reference(llm_like_bits(*shape, seed=sum(shape)))


@pytest.mark.parametrize("shape", SHAPES)
def test_uniform_random_patterns(shape):
    check_against_reference(random_bits(*shape, seed=7 * shape[0] + shape[1]))


@pytest.mark.parametrize("shape", [(239, 70), (300, 200), (1, 3)])
def test_forced_exponents_every_window(shape):
    n, k = shape
    forced = torch.arange(n, dtype=torch.int32) % (E_HI - E_LO + 1) + E_LO  # 16..254, cycled
    check_against_reference(random_bits(n, k, seed=n), exponents=forced)
    check_against_reference(llm_like_bits(n, k, seed=k), exponents=forced.flip(0))


def test_forced_exponents_of_padded_length_and_dtypes():
    bits = llm_like_bits(130, 70, seed=1)
    enc = fast.encode(bits)
    # the exponents of an encode ([N_PAD] u8, padded rows 16) force the same encoding
    assert_same_encoding(fast.encode(bits, exponents=enc[1]), enc)
    assert_same_encoding(fast.encode(bits, exponents=enc[1][:130].to(torch.int64)), enc)


def test_every_pattern_in_one_row_and_lowest_window_on_ties():
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(1, -1)
    check_against_reference(every)
    check_against_reference(every.view(512, 128))
    # two single normal weights 30 binades apart: every window holds at most one, the lowest wins
    row = to_i16([[100 << 7, 130 << 7, 0, 0xFFC0]])
    enc = check_against_reference(row)
    assert int(enc[1][0]) == 100
    # no normal weight at all: E_n = 16, everything escaped
    enc = check_against_reference(to_i16([[0, 0x8000, 0x7F80, 0x0001, 0xFFC3]]))
    assert int(enc[1][0]) == E_LO and enc[3].shape[0] == 5


def test_no_escapes_at_all():
    bits = torch.full((130, 70), 0x3F80, dtype=torch.int16)  # 1.0 everywhere; padding is not escaped
    enc = check_against_reference(bits)
    assert tuple(enc[3].shape) == (0, 2) and int(enc[2].sum()) == 0


def test_spec_worked_example():
    """SPEC.md §10."""
    records, exps, counts, escapes = fast.encode(to_i16([[0x3F80, 0xBF00, 0x0000, 0x4040]]))
    assert records[0, 0, :4].tolist() == [0x70, 0xE8, 0x00, 0x7C] and int(records[0, 0, 8192]) == 0
    assert int(exps[0]) == 128 and counts.tolist() == [[1]] and escapes.tolist() == [[2, 0]]


def test_non_contiguous_input():
    bits = llm_like_bits(200, 150, seed=5)
    assert_same_encoding(fast.encode(bits.t()), reference.encode(bits.t().contiguous()))
    assert_same_encoding(fast.encode(bits[::2, 1:]), reference.encode(bits[::2, 1:].contiguous()))


def test_single_thread_gives_the_same_bytes():
    bits = llm_like_bits(300, 200, seed=11)
    want = fast.encode(bits)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        got = fast.encode(bits)
        dec = fast.decode(*got, 300, 200)
    finally:
        numba.set_num_threads(before)
    assert_same_encoding(got, want)
    assert torch.equal(dec, bits)


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros(4, 4, dtype=torch.bfloat16),
        torch.zeros(4, 4, dtype=torch.int32),
        torch.zeros(16, dtype=torch.int16),
        torch.zeros(2, 2, 2, dtype=torch.int16),
        torch.zeros(0, 4, dtype=torch.int16),
        torch.zeros(4, 0, dtype=torch.int16),
        [[1, 2]],
    ],
)
def test_encode_rejects_non_matrix_inputs(bad):
    with pytest.raises(InputError):
        fast.encode(bad)
    with pytest.raises(InputError):
        fast.check_bits(bad)


@pytest.mark.parametrize(
    "exponents",
    [
        torch.full((5,), 15, dtype=torch.int32),
        torch.full((5,), 255, dtype=torch.int32),
        torch.full((4,), 100, dtype=torch.int32),
        torch.full((5,), 100.0),
        torch.cat([torch.full((5,), 100), torch.full((123,), 17)]),  # N_PAD long, padded rows not 16
    ],
)
def test_encode_rejects_bad_forced_exponents(exponents):
    with pytest.raises(InputError):
        fast.encode(llm_like_bits(5, 9, seed=0), exponents=exponents)


def test_decode_rejects_what_would_go_out_of_bounds():
    n, k = 130, 70  # padded rows and columns
    bits = llm_like_bits(n, k, seed=2, specials=0.05)
    bits[TN:, TK:] = 0  # zeros are escapes: the corner record has entries
    records, exps, counts, escapes = fast.encode(bits)
    assert escapes.shape[0] > 0

    with pytest.raises(TensorLayoutError):
        fast.decode(records[:1], exps, counts, escapes, n, k)
    with pytest.raises(TensorLayoutError):
        fast.decode(records, exps[:n], counts, escapes, n, k)
    with pytest.raises(TensorLayoutError):
        fast.decode(records, exps, counts.to(torch.int64), escapes, n, k)
    with pytest.raises(TensorLayoutError):
        fast.decode(records, exps, counts, escapes.to(torch.int32), n, k)
    with pytest.raises(EscapeCountError):
        fast.decode(records, exps, counts, escapes[1:], n, k)
    neg = counts.clone()
    neg.view(-1)[0] = -1
    neg.view(-1)[1] += 1
    with pytest.raises(EscapeCountError):
        fast.decode(records, exps, neg, escapes, n, k)

    nb, kb = tiles(n, k)
    last = nb * kb - 1  # the corner record: padding in rows and columns
    first_of_last = int(counts.view(-1)[:last].sum())
    assert int(counts.view(-1)[last]) > 0
    for p in (-1, 8192, 32767, (n % TN) * TK, k % TK):  # out of range, padded row, padded column
        bad = escapes.clone()
        bad[first_of_last, 0] = p
        with pytest.raises(EscapePositionError):
            fast.decode(records, exps, counts, bad, n, k)
    with pytest.raises(InputError):
        fast.decode(records, exps, counts, escapes, n, k, lo_fill=16)
    with pytest.raises(W12Error):
        fast.decode(records, exps, counts, escapes, 0, k)


def test_decode_exponents_outside_the_valid_range_like_reference():
    """The decoder does not validate E_n (W12Matrix does); it must still agree with the reference."""
    bits = random_bits(256, 64, seed=3)
    records, exps, counts, escapes = fast.encode(bits)
    n_pad, _ = padded(256, 64)
    wild = torch.arange(n_pad, dtype=torch.int32).remainder(256).to(torch.uint8)  # 0..255, incl. < 16, > 254
    for fill in (None, 8):
        assert torch.equal(
            fast.decode(records, wild, counts, escapes, 256, 64, lo_fill=fill),
            reference.decode(records, wild, counts, escapes, 256, 64, lo_fill=fill),
        )
    assert records.shape[-1] == REC_BYTES


def test_keeps_torch_thread_count():
    """numba's OpenMP start-up must not change torch's thread count (it did: 1 -> the core count)."""
    import subprocess
    import sys

    code = ("import torch; torch.set_num_threads(1)\n"
            "from w12.formats import fast\n"
            "b = (torch.randn(256, 256) * 0.02).to(torch.bfloat16).view(torch.int16)\n"
            "enc = fast.encode(b); assert torch.get_num_threads() == 1, torch.get_num_threads()\n"
            "fast.decode(*enc, 256, 256); assert torch.get_num_threads() == 1, torch.get_num_threads()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
