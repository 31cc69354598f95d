from modelport.optimize.auto import auto_select
from modelport.optimize.pipeline import OptimizeOptions


def test_auto_benchmarks_variants_and_keeps_fastest_within_budget(cnn_ir):
    out, rows, sel = auto_select(cnn_ir, OptimizeOptions(level="auto", budget="cosine>=0.999", bench_runs=5))
    names = [v["variant"] for v in sel["variants"]]
    assert names[:3] == ["raw", "fp32-extended", "fp32-all"] and "fp16" in names and "int8-dynamic" in names
    chosen = next(v for v in sel["variants"] if v["chosen"])
    assert chosen["variant"] == sel["chosen"] and chosen["within_budget"]
    fastest_ok = min((v for v in sel["variants"] if v["within_budget"]), key=lambda v: v["latency_ms"])
    assert chosen is fastest_ok
    assert out.provenance.get("precision", "fp32") == chosen["precision"]


def test_auto_budget_excludes_inaccurate_variants(cnn_ir):
    _, _, sel = auto_select(cnn_ir, OptimizeOptions(level="auto", budget="max_abs<=1e-6", bench_runs=3))
    by = {v["variant"]: v for v in sel["variants"]}
    assert not by["int8-dynamic"]["within_budget"] and not by["fp16"]["within_budget"]
    assert by[sel["chosen"]]["precision"] == "fp32"
