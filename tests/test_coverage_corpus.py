"""The quick set of docs/coverage.md, run again: every (model, route) must end the way the table says.

`bench/model_coverage.py` (`make coverage`) runs the whole corpus and writes docs/coverage.md and
docs/coverage.json; this module rebuilds the quick set's models in a temporary folder and runs each
through each route by the real CLI. A run recorded `ok` must stay ok; a recorded failure must keep
its exit code and its cause line, so a change of behaviour shows here and the table is regenerated
with it. Exit 1 (an unexpected error) is never an accepted outcome.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("modelport_bench_coverage", REPO / "bench" / "model_coverage.py")
coverage = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(coverage)

RECORDED = json.loads((REPO / "docs" / "coverage.json").read_text())
EXPECTED = {(r["model"], r["route"]): r for r in RECORDED["rows"]}
QUICK = [m for m in coverage.CORPUS if m.quick]
ROUTES = coverage.routes()
# the edge targets' columns run from tests/test_coverage_corpus_edge.py, a file of their own so that
# the suite's workers take the two halves side by side
EDGE = ("executorch", "coreml", "tfjs")

pytestmark = pytest.mark.slow


def test_the_recorded_table_covers_the_quick_set_on_every_route():
    assert RECORDED["quick"] == sorted(m.name for m in QUICK)
    assert set(RECORDED["routes"]) == set(ROUTES), "routes changed: regenerate docs/coverage.md with `make coverage`"
    missing = [(m.name, r) for m in QUICK for r in ROUTES if (m.name, r) not in EXPECTED]
    assert not missing, f"not in docs/coverage.json (run `make coverage`): {missing}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coverage-corpus")
    errors = coverage.build_corpus(QUICK, folder)
    assert not errors, errors
    return folder


def check_outcome(model: str, route: str, corpus: Path, tmp_path: Path) -> None:
    want = EXPECTED[(model, route)]
    m = next(m for m in QUICK if m.name == model)
    got = coverage.run_one(m, route, ROUTES[route], corpus, tmp_path, timeout=300)
    assert got["exit"] != 1, f"{model} → {route}: exit 1 (an unexpected error) is a bug: {got['cause']}"
    if want["exit"] == 0:
        assert got["exit"] == 0, f"{model} → {route} was ok and now fails: exit {got['exit']}: {got['cause']}"
    else:
        assert (got["exit"], got["cause"]) == (want["exit"], want["cause"]), (
            f"{model} → {route} changed (regenerate docs/coverage.md with `make coverage` if intended)")


@pytest.mark.parametrize(("model", "route"), [(m.name, r) for m in QUICK for r in ROUTES if r not in EDGE])
def test_quick_set_outcome_is_the_recorded_one(model, route, corpus, tmp_path):
    check_outcome(model, route, corpus, tmp_path)


def test_every_failure_in_the_table_is_a_classified_real_limit():
    """No failure of docs/coverage.json is unclassified or a false refusal (`LIMITS` says what limits each)."""
    kinds = {(r["model"], r["route"]): coverage.classify(r)[0] for r in RECORDED["rows"] if r["exit"] != 0}
    assert {k: v for k, v in kinds.items() if v != "real limit"} == {}


def test_the_table_leaves_no_cell_out():
    """Every model of the corpus on every route has a row: no `–` in docs/coverage.md."""
    assert [(m.name, r) for m in coverage.CORPUS for r in RECORDED["routes"] if (m.name, r) not in EXPECTED] == []


def test_a_failure_is_classified_by_its_cause():
    assert coverage.classify({"cause": "model.json: TF.js cannot run the model: Error in conv2d: depth of input (8) must match "
                                       "input depth for filter 1."})[0] == "real limit"
    assert coverage.classify({"cause": "stage 'parse' took 6.5 GB more memory (this process and its children), past its bound of 6.4 GB"})[0] \
        == "false refusal"
    assert coverage.classify({"cause": "something new"}) == ("unclassified", "")
