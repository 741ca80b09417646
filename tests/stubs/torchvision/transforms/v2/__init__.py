"""Test stand-in for `torchvision.transforms.v2` (tests/stubs/README.md): attribute sink, nothing works."""

from torchvision._sink import __version__, module_getattr  # noqa: F401

__getattr__ = module_getattr("torchvision.transforms.v2")
