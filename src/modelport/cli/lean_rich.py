"""typer's help renderer without the parts that help never uses, so `modelport --help` stays instant.

`typer.rich_utils` imports `rich.markdown` (markdown-it, pygments) and `rich.traceback`
(`rich.pretty`, attrs, pygments) at its top, yet uses `Markdown` only in markdown markup mode
(modelport's help is rich markup) and `Traceback` only to print an unexpected exception's
traceback. Together they cost more than the rest of start-up. `load()` imports `typer.rich_utils`
with those two names bound to stand-ins that import the real class on first use (a call or an
attribute), then restores `sys.modules`, so any other `import rich.markdown` gets the real module.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

# module -> the class typer.rich_utils imports from it
DEFERRED = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


class _Deferred(type):
    """The metaclass of a stand-in: calling it or reading an attribute imports the real class."""

    def real(cls) -> type:
        return getattr(importlib.import_module(cls._module), cls.__name__)

    def __call__(cls, *args, **kwargs):
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(cls.real(), name)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls.real())


def stand_in(module: str, name: str) -> type:
    return _Deferred(name, (), {"_module": module})


def load() -> ModuleType:
    """`typer.rich_utils`, imported (once) without importing the modules in DEFERRED."""
    if "typer.rich_utils" in sys.modules:
        return sys.modules["typer.rich_utils"]
    placed = []
    for module, name in DEFERRED.items():
        if module not in sys.modules:
            stub = ModuleType(module)
            setattr(stub, name, stand_in(module, name))
            sys.modules[module] = stub
            placed.append(module)
    try:
        import typer.rich_utils as rich_utils
    finally:
        for module in placed:  # a module found in sys.modules is not bound on its parent package
            del sys.modules[module]
    return rich_utils
