"""modelport: convert, optimise, validate and package deep-learning models.

The Python API mirrors the CLI: `modelport.convert(source, out_dir, ...)`,
`modelport.inspect(path)` and `modelport.ConvertOptions`, plain functions and a class of the
orchestration layer (`modelport.orchestration`). Heavy frameworks are imported only when a call
needs them: importing modelport (and so the CLI) imports no framework, numpy or onnx.
"""

from __future__ import annotations

from modelport.version import __version__

__all__ = ["ConvertOptions", "__version__", "convert", "inspect"]

_API = ("convert", "inspect", "ConvertOptions")


def __getattr__(name: str):
    if name in _API:
        import modelport.orchestration as orchestration

        return getattr(orchestration, name)
    raise AttributeError(f"module 'modelport' has no attribute {name!r}")
