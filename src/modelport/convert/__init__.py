"""Orchestration: the convert pipeline, validation and reports. `convert()` and `inspect()` are
the Python API behind the CLI commands of the same names."""

from __future__ import annotations

from modelport.convert.inspect import inspect
from modelport.convert.pipeline import ConvertOptions, convert

__all__ = ["ConvertOptions", "convert", "inspect"]
