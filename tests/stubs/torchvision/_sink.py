"""Inert placeholders: any attribute is another placeholder; calling one raises (see ../README.md)."""



__version__ = "0.0.0+w12stub"


class Sink:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Sink(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: torchvision is a test stand-in here (tests/stubs); images are not supported")

    def __mro_entries__(self, bases):  # `class X(torchvision.something)` still defines a class
        return (object,)

    def __repr__(self):
        return f"<w12 test stub {self._name}>"


def module_getattr(modname):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Sink(f"{modname}.{attr}")

    return __getattr__



