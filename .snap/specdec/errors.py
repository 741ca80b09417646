"""Errors of the speculative-decoding layer: one subclass of W12Error per failure. The library raises;
only the CLI prints and exits."""

from w12.formats.errors import W12Error


class SpecdecError(W12Error):
    """Base class of every error `w12.specdec` raises."""


class LatticeError(SpecdecError):
    """A lattice has inconsistent shapes (ids, log-probs, parent-conditioned scores)."""


class TreeError(SpecdecError):
    """A tree is not prefix-closed or topologically ordered, or a builder got a bad budget/depth."""


class DrafterError(SpecdecError):
    """A drafter cannot draft for this target (tokenizer/vocab mismatch, unknown drafter name)."""


class CacheLayoutError(SpecdecError):
    """The target's KV cache has layers the engine cannot crop/gather (sliding window, recurrent state)."""


class RecordError(SpecdecError):
    """A recorded-lattice file is missing, not JSON, or has another version/shape than expected."""


class PromptFileError(SpecdecError):
    """A prompt file is missing or a line is not `{"turns": [...]}` JSON."""
