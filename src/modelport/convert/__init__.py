"""Orchestration: the convert pipeline, validation and reports. `convert()` and `inspect()` are
the Python API behind the CLI commands of the same names.

`modelport.convert` is both this package and the API function: importing any submodule binds
the package to the name `convert` on `modelport`, so the package itself is made callable and
`from modelport import convert; convert(src, out)` works whatever was imported first.
"""

from __future__ import annotations

import sys
import types

from modelport.convert.inspect import inspect
from modelport.convert.pipeline import ConvertOptions, convert

__all__ = ["ConvertOptions", "convert", "inspect"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return convert(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
