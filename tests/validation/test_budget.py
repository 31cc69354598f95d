"""The one `--accuracy-budget` grammar both budgets are parsed with: keys, operators, ranges, the caller's message."""

from __future__ import annotations

import pytest

from modelport.errors import BadInputError
from modelport.validation.budget import BudgetKey, parse_clauses

KEYS = (BudgetKey("tokens", ">=", ("token_agreement",), 0.0, 1.0), BudgetKey("max_abs", "<=", ("abs",), 0.0))


def test_clauses_by_canonical_key_case_and_dash_insensitive():
    assert parse_clauses(" Token-Agreement >= 0.5 , ABS<=2 ,", KEYS, "bad") == {"tokens": 0.5, "max_abs": 2.0}
    assert parse_clauses("tokens>=0.2,tokens>=0.7", KEYS, "bad") == {"tokens": 0.7}  # the last one counts
    assert parse_clauses("", KEYS, "bad") == {}


@pytest.mark.parametrize("text", ["tokens=0.5", "tokens<=0.5", "speed>=2", "tokens>=x", "tokens>=1.5", "max_abs<=-1",
                                  "tokens>=nan", "tokens>="])
def test_every_bad_clause_raises_the_callers_message(text):
    with pytest.raises(BadInputError, match="^use tokens>= please$"):
        parse_clauses(text, KEYS, "use tokens>= please")


def test_both_budgets_share_it_and_keep_their_messages():
    from modelport.optimize.pipeline import parse_budget
    from modelport.validation.generation import GenerationBudget, parse_generation_budget

    with pytest.raises(BadInputError, match=r"^bad --accuracy-budget 'tokens>=0.9': use cosine>=0.999 and/or max_abs<=0.01$"):
        parse_budget("tokens>=0.9")
    with pytest.raises(BadInputError, match=r"^bad --accuracy-budget 'atol<=0.9' for text generation: use tokens>=0.95"):
        parse_generation_budget("atol<=0.9")
    assert parse_generation_budget("tokens>=0.5, cosine>=0.98") == GenerationBudget(0.5, None, 0.98)
    t = parse_budget("cos>=0.99, atol<=0.5")
    assert (t.min_cosine, t.atol, t.rtol, t.scaled) == (0.99, 0.5, 0.0, False)
    t = parse_budget("cosine>=0.9")
    assert t.atol == float("inf") and t.rtol == float("inf")
    assert parse_generation_budget("logits<=3") == GenerationBudget(1.0, 3.0)
