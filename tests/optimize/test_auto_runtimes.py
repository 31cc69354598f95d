"""`--optimize auto` across runtimes: onnxruntime and OpenVINO candidates, a deterministic timer.

The timer is injected (`OptimizeOptions.timer`): every candidate is really built, run and judged
for accuracy, only the latency each reports is fixed, so which one wins is decided by the table.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.optimize.auto import auto_select
from modelport.optimize.pipeline import OptimizeOptions
from modelport.runtimes import check_runtimes, default_runtimes
from modelport.runtimes.openvino import supports
from tests.optimize.conftest import make_ir


def small_mlp():
    rng = np.random.default_rng(1)
    from onnx import helper

    return make_ir([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                    helper.make_node("MatMul", ["r", "w2"], ["y"])],
                   [("x", [4, 64])], [("y", [4, 16])],
                   {"w1": rng.standard_normal((64, 128)) * 0.1, "w2": rng.standard_normal((128, 16)) * 0.1})


def fake_timer(latencies: dict[str, float]):
    """Latency by candidate name; the candidate still runs once (a crash would show)."""
    seen = []

    def timer(row, run):
        run()
        seen.append(row)
        return latencies.get(row["variant"], 10.0)

    timer.seen = seen
    return timer


def test_openvino_candidate_wins_when_fastest_within_budget():
    ir = small_mlp()
    timer = fake_timer({"raw": 10.0, "openvino-fp32": 9.0, "openvino-bf16": 4.0, "int8-dynamic": 3.0,
                        "openvino-int8-weights": 5.0})
    out, rows, sel = auto_select(ir, OptimizeOptions(level="auto", runtimes="onnxruntime,openvino", budget="cosine>=0.999",
                                                     timer=timer))
    by = {v["variant"]: v for v in sel["variants"]}
    assert {v["runtime"] for v in sel["variants"]} == {"onnxruntime", "openvino"}
    assert by["openvino-fp32"]["inference_precision"] == "fp32" and by["openvino-fp32"]["within_budget"]
    assert [r["variant"] for r in timer.seen] == list(by)  # every candidate timed once, through the injected timer
    fastest = min((v for v in sel["variants"] if v["within_budget"]), key=lambda v: v["latency_ms"])
    assert sel["chosen"] == fastest["variant"] and fastest["chosen"]
    assert sel["runtime"] == fastest["runtime"] and sel["precision"] == fastest["precision"]
    if sel["runtime"] == "openvino":
        assert out is ir and rows == []  # OpenVINO compiles the model as given


@pytest.mark.skipif(not supports("bf16"), reason="needs a CPU with BF16")  # this project's CPU has AVX512-BF16
def test_bf16_on_this_cpu_is_a_candidate_and_wins_on_latency():
    ir = small_mlp()
    timer = fake_timer({"openvino-bf16": 1.0})
    _, _, sel = auto_select(ir, OptimizeOptions(level="auto", runtimes="onnxruntime,openvino", budget="cosine>=0.999",
                                                timer=timer))
    row = next(v for v in sel["variants"] if v["variant"] == "openvino-bf16")
    assert row["inference_precision"] == "bf16" and row["within_budget"] and 0.999 <= row["cosine"] < 1.0 + 1e-9
    assert sel["chosen"] == "openvino-bf16" and sel["runtime"] == "openvino" and sel["precision"] == "bf16"


def test_a_budget_keeps_an_inaccurate_fast_candidate_out():
    ir = small_mlp()
    timer = fake_timer({"openvino-bf16": 0.5, "openvino-int8-weights": 0.5, "int8-dynamic": 0.5, "fp16": 0.5, "raw": 3.0})
    _, _, sel = auto_select(ir, OptimizeOptions(level="auto", runtimes="onnxruntime,openvino", budget="max_abs<=1e-6",
                                                timer=timer))
    chosen = next(v for v in sel["variants"] if v["chosen"])
    assert chosen["precision"] == "fp32" and chosen["within_budget"]
    assert not any(v["within_budget"] for v in sel["variants"] if v["precision"] in ("bf16", "int8", "fp16"))


def test_runtimes_are_checked_and_default_to_the_targets_runtimes():
    from modelport.errors import BadInputError

    assert check_runtimes("openvino, onnxruntime,openvino") == ("openvino", "onnxruntime")
    with pytest.raises(BadInputError, match="unknown runtime 'tensorflow'.*known: onnxruntime, openvino"):
        OptimizeOptions(level="auto", runtimes="tensorflow")
    assert default_runtimes(["onnx"]) == ("onnxruntime",)
    assert default_runtimes(["onnx", "openvino"]) == ("onnxruntime", "openvino")


def test_convert_writes_the_openvino_winner_and_names_its_runtime(tmp_path):
    """Through the pipeline: the winner's runtime decides the target; the artifact is validated in OpenVINO."""
    import onnx

    from modelport.orchestration import ConvertOptions, convert

    ir = small_mlp()
    onnx.save(ir.model, str(tmp_path / "m.onnx"))
    winner = "openvino-bf16" if supports("bf16") else "openvino-fp32"
    timer = fake_timer({winner: 1.0})
    opts = ConvertOptions(targets=["onnx"], optimize=OptimizeOptions(level="auto", runtimes=("onnxruntime", "openvino"),
                                                                     budget="cosine>=0.999", timer=timer))
    report = convert(tmp_path / "m.onnx", tmp_path / "out", opts)
    assert report["optimize"]["chosen"] == winner and report["optimize"]["runtime"] == "openvino"
    (art,) = report["artifacts"]
    assert art["target"] == "openvino" and art["runtime"] == "openvino" and art["precision"] == winner.split("-")[1]
    assert (tmp_path / "out" / "model.xml").is_file() and not (tmp_path / "out" / "model.onnx").exists()
    from modelport.runtimes.openvino import HINTS, core

    # the IR carries the precision the winner was measured at, where OpenVINO keeps runtime options
    written = core().read_model(str(tmp_path / "out" / "model.xml"))
    assert written.get_rt_info(["runtime_options", "INFERENCE_PRECISION_HINT"]).astype(str) == HINTS[art["precision"]]
    assert art["inference_precision"] == art["precision"]
    assert any("onnx not written" in w for w in report["warnings"])
    assert report["parity"][-1]["ok"] and report["parity"][-1]["hop"].endswith("openvino (end to end)")
    assert json.loads((tmp_path / "out" / "report.json").read_text())["optimize"]["runtime"] == "openvino"
    import jsonschema

    from modelport.validation.report import SCHEMA_FILE

    jsonschema.validate(report, json.loads(SCHEMA_FILE.read_text()))


def test_convert_cli_shows_the_candidates_per_runtime(cli, tmp_path):
    import onnx

    onnx.save(small_mlp().model, str(tmp_path / "m.onnx"))
    r = cli("convert", tmp_path / "m.onnx", "--optimize", "auto", "--runtimes", "onnxruntime,openvino",
            "--accuracy-budget", "cosine>=0.999", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert f"auto: chose {report['optimize']['chosen']} ({report['optimize']['runtime']})" in r.stderr  # the table's title
    assert {v["runtime"] for v in report["optimize"]["variants"]} == {"onnxruntime", "openvino"}
    written = report["artifacts"][0]
    assert written["runtime"] == report["optimize"]["runtime"]  # the winner's runtime wrote the artifact
    r = cli("convert", tmp_path / "m.onnx", "--optimize", "auto", "--runtimes", "tensorflow", "-o", tmp_path / "x")
    assert r.exit_code == 2 and "unknown runtime 'tensorflow'" in r.stderr
