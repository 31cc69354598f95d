"""modelport: convert, optimise, validate and package deep-learning models.

The Python API mirrors the CLI: `modelport.convert(source, out_dir, ...)`,
`modelport.inspect(path)`. Heavy frameworks are imported only when a call needs them.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "convert", "inspect"]


def __getattr__(name: str):
    # Lazy: importing modelport (and so the CLI) must not import numpy, onnx or a framework.
    if name == "convert":
        import modelport.convert as _convert_pkg  # a callable module: see convert/__init__.py

        return _convert_pkg
    if name in ("inspect", "ConvertOptions"):
        import modelport.convert as _convert_pkg

        return getattr(_convert_pkg, name)
    raise AttributeError(f"module 'modelport' has no attribute {name!r}")
