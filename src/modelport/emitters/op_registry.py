"""The registry both ONNX-op translators use: the PyTorch code generator's converters
(`pytorch_code/registry.py`) and the ONNX → TensorFlow lowering's ops (`onnx_tf_common.py`), each
with its own `OpRegistry`.

A translator registers with `@REGISTRY.register("Conv")` (several op types at once as a tuple;
`since=`/`until=`: the inclusive opset range it covers, `until=None` for no upper bound;
`domain=` for a custom domain). The caller looks a node up with `lookup(op_type, opset)`, which
returns the entry whose range holds the model's opset, and passes that opset to the translator
itself. An entry whose range overlaps another's for the same op is refused when it registers; a
lookup no range answers raises `OpNotFound` naming the domain, op and opset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class OpEntry:
    op_type: str
    fn: Callable
    since: int = 1
    until: int | None = None  # inclusive; None: every later opset
    domain: str = ""
    origin: str = ""  # the module that registered it, named when a duplicate is refused

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)

    def span(self) -> str:
        return f"{self.since}+" if self.until is None else f"{self.since}-{self.until}"


class OpNotFound(KeyError):
    """No entry for a node's domain, op type and opset; the message names all three."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class OpRegistry:
    """Translators by (domain, op type), each over an opset range; `kind` names them in errors
    ("converter", "TensorFlow form")."""

    def __init__(self, kind: str):
        self.kind = kind
        self._by_op: dict[tuple[str, str], list[OpEntry]] = {}

    def register(self, op_type: str | tuple[str, ...], *, since: int = 1, until: int | None = None, domain: str = ""):
        """Decorator: registers the function for each op type over opsets since..until (inclusive)."""

        def wrap(fn):
            origin = getattr(fn, "__module__", "").rsplit(".", 1)[-1]
            for op in (op_type,) if isinstance(op_type, str) else op_type:
                self.add(OpEntry(op, fn, since, until, domain, origin))
            return fn

        return wrap

    def add(self, entry: OpEntry) -> None:
        if entry.until is not None and entry.until < entry.since:
            raise ValueError(f"{self.kind} for {_label(entry.domain, entry.op_type)}: empty opset range {entry.since}-{entry.until}")
        key = (_norm(entry.domain), entry.op_type)
        for other in self._by_op.get(key, []):
            if _overlap(entry, other):
                raise ValueError(
                    f"duplicate {self.kind} for {_label(entry.domain, entry.op_type)} opsets {entry.span()} "
                    f"({entry.origin}) overlaps {other.span()} ({other.origin})"
                )
        self._by_op.setdefault(key, []).append(entry)

    def find(self, op_type: str, opset: int, domain: str = "") -> OpEntry | None:
        """The entry for `op_type` whose opset range holds `opset`, else None."""
        for entry in self._by_op.get((_norm(domain), op_type), []):
            if entry.covers(opset):
                return entry
        return None

    def lookup(self, op_type: str, opset: int, domain: str = "") -> OpEntry:
        """As `find`, raising `OpNotFound` (a KeyError) naming the domain, op and opset when no entry covers it."""
        entry = self.find(op_type, opset, domain)
        if entry is None:
            raise OpNotFound(f"no {self.kind} for {_label(domain, op_type)} at opset {opset}")
        return entry

    def ops(self) -> dict[str, list[OpEntry]]:
        """op type -> its entries, for docs and coverage tables."""
        out: dict[str, list[OpEntry]] = {}
        for (_, op), entries in sorted(self._by_op.items()):
            out.setdefault(op, []).extend(entries)
        return out


def _overlap(a: OpEntry, b: OpEntry) -> bool:
    return (a.until is None or b.since <= a.until) and (b.until is None or a.since <= b.until)


def _norm(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _label(domain: str, op_type: str) -> str:
    return f"{_norm(domain) or 'ai.onnx'}::{op_type}"
