"""The quick set of docs/coverage.md on the edge targets' columns (executorch, coreml, tfjs), run
again as tests/test_coverage_corpus.py runs the others: the same check, in a file of its own so the
suite's workers run the two side by side."""

from __future__ import annotations

import pytest

import tests.test_coverage_corpus as table

pytestmark = pytest.mark.slow

corpus = table.corpus  # the quick set's models, built once for this module


@pytest.mark.parametrize(("model", "route"), [(m.name, r) for m in table.QUICK for r in table.ROUTES if r in table.EDGE])
def test_quick_set_outcome_on_the_edge_targets_is_the_recorded_one(model, route, corpus, tmp_path):
    table.check_outcome(model, route, corpus, tmp_path)
