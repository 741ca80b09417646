"""Errors of the checkpoint layer: one subclass per failure, each message says what to do next."""

from w12.formats.errors import DiskFullError, W12Error  # noqa: F401  (DiskFullError: raised by both layers)


class SourceNotFoundError(W12Error):
    """The source folder does not exist (and is not a reachable Hub id)."""


class HubUnreachableError(W12Error):
    """A Hub id was given but the Hub cannot be reached."""


class NoSafetensorsError(W12Error):
    """The source folder holds no safetensors weights."""


class PickleOnlyError(W12Error):
    """The source holds only pickle weights (.bin/.pt), which W12 never unpickles."""


class NotBF16Error(W12Error):
    """A matrix to convert is not BF16 and --cast-bf16 was not given."""


class OutputExistsError(W12Error):
    """The output folder is not empty and neither --resume nor --overwrite was given."""


class ResumeMismatchError(W12Error):
    """--resume was given for an output folder made from another source or with other options."""


class NotW12CheckpointError(W12Error):
    """A folder given as a W12 checkpoint is not one (no W12 shards, or an unfinished conversion)."""


class BadIndexError(W12Error):
    """A safetensors index (model.safetensors.index.json) is malformed or names missing files."""
