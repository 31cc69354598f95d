"""Converters keyed by (domain, op type, opset range); one module per op family registers its own.

A converter is a function taking a `NodeView` and writing the node's code through it. Families
declare their converters with `@converter("Conv")` (optionally `since=`/`until=` opset bounds) into
their module's `CONVERTERS` list; `default_table()` loads the families named in `FAMILIES`,
so every entry can be found from here. A duplicate (same op, overlapping opsets) is rejected,
and a failed lookup names the domain, op and opset.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

FAMILIES = (
    "activation", "elementwise", "linear", "conv", "pooling", "normalization", "shape", "indexing",
    "reduce", "rnn", "resize", "control", "contrib",
)
MAX_OPSET = 10_000


@dataclass(frozen=True)
class Converter:
    op_type: str
    fn: Callable
    since: int = 1
    until: int = MAX_OPSET  # inclusive
    domain: str = ""
    family: str = ""

    def covers(self, opset: int) -> bool:
        return self.since <= opset <= self.until


def converter(op_type: str | tuple[str, ...], *, since: int = 1, until: int = MAX_OPSET, domain: str = ""):
    """Decorator for a family module: appends Converter entries to the module's CONVERTERS list."""

    def wrap(fn):
        import sys

        table = sys.modules[fn.__module__].__dict__.setdefault("CONVERTERS", [])
        family = fn.__module__.rsplit(".", 1)[-1]
        for op in (op_type,) if isinstance(op_type, str) else op_type:
            table.append(Converter(op, fn, since, until, domain, family))
        return fn

    return wrap


class ConverterTable:
    """Converters by (domain, op type), each over an opset range; overlapping entries are rejected."""

    def __init__(self):
        self._by_op: dict[tuple[str, str], list[Converter]] = {}

    def add(self, conv: Converter) -> None:
        key = (_norm(conv.domain), conv.op_type)
        for other in self._by_op.get(key, []):
            if conv.since <= other.until and other.since <= conv.until:
                raise ValueError(
                    f"duplicate converter for {key[0] or 'ai.onnx'}::{conv.op_type} opsets "
                    f"{conv.since}-{conv.until} ({conv.family}) overlaps {other.since}-{other.until} ({other.family})"
                )
        self._by_op.setdefault(key, []).append(conv)

    def find(self, domain: str, op_type: str, opset: int) -> Converter | None:
        for conv in self._by_op.get((_norm(domain), op_type), []):
            if conv.covers(opset):
                return conv
        return None

    def lookup(self, domain: str, op_type: str, opset: int) -> Converter:
        conv = self.find(domain, op_type, opset)
        if conv is None:
            raise KeyError(f"no converter for {_norm(domain) or 'ai.onnx'}::{op_type} at opset {opset}")
        return conv

    def ops(self) -> dict[str, list[Converter]]:
        """op type -> converters, for docs and coverage tables."""
        out: dict[str, list[Converter]] = {}
        for (_, op), convs in sorted(self._by_op.items()):
            out.setdefault(op, []).extend(convs)
        return out


def _norm(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@lru_cache(maxsize=1)
def default_table() -> ConverterTable:
    reg = ConverterTable()
    for family in FAMILIES:
        module = importlib.import_module(f"modelport.emitters.pytorch_code.{family}")
        for conv in module.CONVERTERS:
            reg.add(conv)
    return reg
