"""Constants and size formulas of the W12 format (SPEC.md §2, §5, §7). Pure Python, no torch."""

TN = 128  # rows (output channels) per tile
TK = 64  # columns (inputs) per tile
TW = TN * TK  # weights per tile
VIEW_BYTES = TW  # 8-bit view: one byte per weight
NIB_BYTES = TW // 2  # low nibbles: two weights per byte
REC_BYTES = VIEW_BYTES + NIB_BYTES  # 12288 bytes per record
WIN = 16  # binades per window
E_LO, E_HI = 16, 254  # range of a row's top exponent E_n
BIAS = 112  # exponent bias of the scaled decode: 0b0111_0000
FORMAT_NAME = "w12"
FORMAT_VERSION = 1
HEADER_KEY = "w12"  # safetensors metadata key of the W12 header
MAX_DIM = 2**31 - 1

# Names of the four tensors of a matrix whose original weight is "<P>.weight" (SPEC.md §7).
RECORDS_SUFFIX = ".weight"
EXPONENTS_SUFFIX = ".weight_exponents"
COUNTS_SUFFIX = ".weight_esc_counts"
ESCAPES_SUFFIX = ".weight_escapes"
COMPANION_SUFFIXES = (EXPONENTS_SUFFIX, COUNTS_SUFFIX, ESCAPES_SUFFIX)


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def tiles(n: int, k: int) -> tuple[int, int]:
    """(NB, KB) = (ceil(N/128), ceil(K/64))."""
    return ceil_div(n, TN), ceil_div(k, TK)


def padded(n: int, k: int) -> tuple[int, int]:
    """(N_PAD, K_PAD) = (NB·128, KB·64)."""
    nb, kb = tiles(n, k)
    return nb * TN, kb * TK


def companion_names(weight_name: str) -> dict[str, str]:
    """The four tensor names of the W12 matrix stored for `weight_name` ("P.weight")."""
    if not weight_name.endswith(RECORDS_SUFFIX):
        raise ValueError(f"a W12 matrix name must end with '.weight', got {weight_name!r}")
    base = weight_name[: -len(RECORDS_SUFFIX)]
    return {
        "records": weight_name,
        "exponents": base + EXPONENTS_SUFFIX,
        "counts": base + COUNTS_SUFFIX,
        "escapes": base + ESCAPES_SUFFIX,
    }


def stored_bytes(n: int, k: int, nnz: int) -> int:
    """Bytes of the four tensors: records + exponents + counts + escapes."""
    nb, kb = tiles(n, k)
    return nb * kb * REC_BYTES + nb * TN + 4 * nb * kb + 4 * nnz


def bits_per_weight(n: int, k: int, nnz: int) -> float:
    """SPEC.md §12: (12·N_PAD·K_PAD + 8·N_PAD + 32·NB·KB + 32·nnz) / (N·K)."""
    return 8.0 * stored_bytes(n, k, nnz) / (n * k)
