"""One error type for everything W12 rejects, one subclass per failure (SPEC.md §9).

Messages say what was expected, what was found and what to do next. The library raises; only the
CLI prints and exits.
"""


class W12Error(Exception):
    """Base class of every error the W12 library raises on bad input."""


class HeaderError(W12Error):
    """The `w12` header in the safetensors metadata is missing, not JSON, or malformed."""


class VersionError(W12Error):
    """The file's format version is one this reader does not implement."""


class ShapeError(W12Error):
    """A matrix shape in the header is not two integers in [1, 2^31 − 1]."""


class MissingTensorError(W12Error):
    """A listed W12 matrix lacks one of its four tensors, or a companion tensor has no listed matrix."""


class TensorLayoutError(W12Error):
    """A W12 tensor has another dtype or shape than SPEC.md §7 gives."""


class ExponentError(W12Error):
    """A row's top exponent E_n is outside [16, 254], or a padded row's is not 16."""


class EscapeCountError(W12Error):
    """A record's escape count is outside [0, 8192], or the counts do not add up to the entries."""


class EscapePositionError(W12Error):
    """An escape position is out of range, not strictly increasing, or in padding."""


class NonCanonicalError(W12Error):
    """An escape's code is not zero, an escaped value is in its row's window, or padding is not zero."""


class InputError(W12Error):
    """An encoder input is not a 2-D BF16 matrix (or not the expected shape/dtype)."""


class SliceError(W12Error):
    """A slice of a W12 matrix is empty, out of range, or not on a tile boundary where one is required."""


class ContainerError(W12Error):
    """A safetensors file cannot be read or written as a W12 container."""


class DiskFullError(W12Error):
    """Not enough free space for the output, or the disk filled up while writing."""
