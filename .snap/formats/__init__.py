"""The W12 format: bit layout (SPEC.md), codecs, the in-memory matrix type and the container."""

from .errors import W12Error  # noqa: F401
