"""Test stand-in for `torchvision.transforms.v2.functional` (tests/stubs/README.md): attribute sink, nothing works."""

from torchvision._sink import module_getattr

__getattr__ = module_getattr("torchvision.transforms.v2.functional")
