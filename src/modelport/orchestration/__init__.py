"""Orchestration, the top of the stack: the convert pipeline, `validate`, `inspect`, and the
optimisation and packaging stages as `convert` runs them. It calls parsers, optimize, emitters
and serving; nothing below imports it. `convert()`, `inspect()` and `ConvertOptions` are the
Python API behind the CLI commands of the same names (re-exported as `modelport.convert`, …).
"""

from __future__ import annotations

from modelport.orchestration.convert import ConvertOptions, convert
from modelport.orchestration.inspect import inspect

__all__ = ["ConvertOptions", "convert", "inspect"]
