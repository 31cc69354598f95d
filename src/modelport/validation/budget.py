"""The `--accuracy-budget` grammar: `key op value` clauses, comma-separated (`cosine>=0.999, max_abs<=0.01`).

The optimisation stage (cosine, max_abs) and validation by generation (tokens, max_abs) take
different keys; each names the keys it accepts (aliases, the one operator and the range allowed)
and the message a bad budget gets. This module only splits and checks the clauses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from modelport.errors import BadInputError

OPERATORS = (">=", "<=")


@dataclass(frozen=True)
class BudgetKey:
    """One key a budget takes: its canonical `name`, other spellings, its operator, its value's range."""

    name: str
    op: str
    aliases: tuple[str, ...] = ()
    low: float = -math.inf
    high: float = math.inf

    def matches(self, key: str) -> bool:
        return key == self.name or key in self.aliases


def parse_clauses(text: str, keys: Sequence[BudgetKey], error: str) -> dict[str, float]:
    """{canonical key: value} of the clauses of `text` (a key given twice: the last one counts).

    Keys are case-insensitive, `-` and `_` alike. A clause without an operator, with an unknown key,
    the wrong operator, a value that is not a number or out of its key's range raises
    BadInputError(`error`)."""
    values: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        op = next((sep for sep in OPERATORS if sep in part), None)
        if op is None:
            raise BadInputError(error)
        key, _, value = part.partition(op)
        key = key.strip().lower().replace("-", "_")
        try:
            v = float(value)
        except ValueError:
            raise BadInputError(error) from None
        spec = next((k for k in keys if k.matches(key)), None)
        if spec is None or spec.op != op or not spec.low <= v <= spec.high:
            raise BadInputError(error)
        values[spec.name] = v
    return values
