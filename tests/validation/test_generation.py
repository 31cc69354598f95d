"""The generation comparison: agreement, first divergence, logit error only on agreeing contexts,
budgets, teacher forcing, rows a runtime stopped early."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.errors import BadInputError
from modelport.validation.generation import (
    Generation,
    GenerationBudget,
    compare_generation,
    fixed_prompts,
    left_padded,
    parse_generation_budget,
)


def _gen(tokens, logits=None):
    tokens = np.array(tokens, dtype=np.int64)
    if logits is None:
        logits = np.zeros((*tokens.shape, 8), dtype=np.float32)
    return Generation(tokens=tokens, logits=np.asarray(logits, dtype=np.float32))


def test_identical_generations_pass():
    r = compare_generation(_gen([[1, 2, 3], [4, 5, 6]]), _gen([[1, 2, 3], [4, 5, 6]]), hop="h")
    assert r.ok and r.tokens == 1.0 and r.first_divergence == [None, None]


def test_a_different_token_fails_fp32_naming_where():
    r = compare_generation(_gen([[1, 2, 3], [4, 5, 6]]), _gen([[1, 2, 3], [4, 7, 6]]), hop="h")
    assert not r.ok and r.first_divergence == [None, 1] and "first divergence" in r.reason
    assert r.tokens == pytest.approx(5 / 6)


def test_logits_after_a_divergence_are_not_compared():
    ref = np.zeros((1, 3, 8))
    got = ref.copy()
    got[0, 2] += 50.0  # after the divergence at step 1: another context, not an error of the model
    r = compare_generation(_gen([[1, 2, 3]], ref), _gen([[1, 5, 3]], got), hop="h", budget=GenerationBudget(0.5))
    assert r.max_abs == 0.0 and r.ok
    forced = compare_generation(_gen([[1, 2, 3]], ref), _gen([[1, 5, 3]], got), hop="h", budget=GenerationBudget(0.5),
                                forced=True)
    assert forced.max_abs == 50.0  # teacher-forced: every step shares the reference's context


def test_logit_error_beyond_tolerance_fails_fp32():
    ref = np.ones((1, 2, 8))
    got = ref.copy()
    got[0, 1, 3] += 1e-2
    r = compare_generation(_gen([[1, 2]], ref), _gen([[1, 2]], got), hop="h")
    assert not r.ok and "logits differ" in r.reason


def test_budget_judges_quantised_generations():
    ref, got = _gen([[1, 2, 3, 4]]), _gen([[1, 2, 3, 9]])
    assert compare_generation(ref, got, hop="h", budget=parse_generation_budget("tokens>=0.75")).ok
    r = compare_generation(ref, got, hop="h", budget=parse_generation_budget("tokens>=0.8"))
    assert not r.ok and "budget tokens>=0.8" in r.reason


def test_rows_stopped_early_compare_what_was_produced():
    r = compare_generation(_gen([[1, 2, 3, 4]]), _gen([[1, 2, -1, -1]]), hop="h")
    assert r.ok and r.tokens == 1.0


def test_nan_logits_fail():
    got = np.zeros((1, 2, 8))
    got[0, 0, 0] = np.nan
    assert not compare_generation(_gen([[1, 2]]), _gen([[1, 2]], got), hop="h").ok


@pytest.mark.parametrize("text", ["cosine<=0.9", "cosine>=2", "atol<=0.1", "tokens>=2", "tokens<=0.5", "max_abs>=1", "tokens>=x"])
def test_bad_budgets_are_exit_2(text):
    with pytest.raises(BadInputError, match="for text generation"):
        parse_generation_budget(text)


def test_budget_texts():
    assert parse_generation_budget("tokens>=0.95, max_abs<=2") == GenerationBudget(0.95, 2.0)
    assert parse_generation_budget(None) is None


def test_prompts_are_fixed_left_padded_and_avoid_the_pad_id():
    prompts = fixed_prompts(50, avoid=(0,))
    assert prompts == fixed_prompts(50, avoid=(0,)) and all(0 not in p for p in prompts)
    ids, mask = left_padded([[5, 6, 7], [8]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
