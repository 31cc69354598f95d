"""`convert --task text-generation` with the streamed reference: each artifact's own greedy tokens
judged against fp32 logits computed a layer at a time from the safetensors (no model held), chosen
with `--reference streamed` or by the memory estimate when the fp32 model does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hf_folders import build

SCHEMA = Path(__file__).resolve().parents[2] / "src/modelport/validation/report.schema.json"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build("llama", tmp_path_factory.mktemp("src") / "llama")


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Path:
    """A Qwen2 folder whose layers outweigh its (untied) embedding: the fp32 reference's estimate
    is then well above the streamed route's."""
    return build("qwen2", tmp_path_factory.mktemp("src") / "deep", hidden_size=128, intermediate_size=512, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False)


def _stage(report: dict, name: str) -> dict:
    return next(s for s in report["stages"] if s["name"] == name)


def test_fp32_against_the_streamed_reference_is_exact(cli, llama, tmp_path):
    """FP32 judged by the streamed reference: identical top-1 at every step and logits within the fp32
    tolerance, for our loop and for onnxruntime-genai; no transformers generation runs; the IR is
    checked on a prefill of each prompt."""
    import jsonschema

    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "--to", "onnx,ort-genai", "-o", out, "--json", "--new-tokens", "8",
            "--reference", "streamed")
    assert r.exit_code == 0, r
    report = r.json()
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    names = [s["name"] for s in report["stages"]]
    assert "reference:generate" not in names
    assert _stage(report, "preflight:memory")["reference"] == "streamed"
    ir = _stage(report, "validate:ir")
    assert ir["ok"] and ir["token_agreement"] == 1.0 and ir["max_abs"] < 1e-4 and ir["positions"] == 7 + 4 + 1
    gens = report["generation"]
    assert [g["hop"].split(" ")[0] for g in gens] == ["streamed→onnx", "streamed→ort-genai"]
    for g in gens:
        assert g["ok"] and g["reference"] == "streamed" and "teacher-forced" in g["measure"]
        assert g["token_agreement"] == 1.0 and g["max_abs"] < 1e-4 and g["cosine_min"] > 0.999999 and g["top5"] == 1.0
        assert g["new_tokens"] == 8 and g["prompts"] == 3
    assert gens[1]["runtime_agreement"] == 1.0


def test_int4_reports_the_measures_and_the_budget_it_was_judged_by(cli, llama, tmp_path):
    """int4 with --optimize all: the fused fp32 graph checked on the prefill before it is quantised
    (the export only when the fused graph misses: see the next test),
    the artifacts judged by top-1 agreement, logit error and cosine at their own context, the budget
    named in the report; a budget the int4 logits cannot reach is exit 4 naming the least cosine."""
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "--to", "onnx,ort-genai", "-o", out, "--json", "--new-tokens", "8",
            "--reference", "streamed", "--precision", "int4", "--optimize", "all", "--accuracy-budget", "tokens>=0.5,cosine>=0.9")
    assert r.exit_code == 0, r
    report = r.json()
    fused = _stage(report, "validate:fused")
    assert fused["ok"] and fused["token_agreement"] == 1.0 and fused["max_abs"] < 1e-4
    assert "validate:ir" not in [s["name"] for s in report["stages"]]  # the fused graph checked stands for the export
    assert _stage(report, "optimize:decoder-fusion")["kept"]
    for g in report["generation"]:
        assert g["ok"] and g["precision"] == "int4" and g["budget"] == "tokens>=0.5, cosine>=0.9"
        assert 0.9 <= g["cosine_min"] <= g["cosine_mean"] < 1.0 and 0 < g["max_abs"] < 1 and 0 < g["top5"] <= 1
    assert report["generation"][1]["runtime_agreement"] == 1.0
    out2 = tmp_path / "strict"
    r = cli("convert", llama, "--task", "text-generation", "-o", out2, "--new-tokens", "4", "--reference", "streamed",
            "--precision", "int4", "--accuracy-budget", "tokens>=0,cosine>=0.99999")
    assert r.exit_code == 4, r
    assert "least logit cosine" in r.stderr and "budget tokens>=0, cosine>=0.99999" in r.stderr
    assert not out2.exists()


def test_the_streamed_judge_fails_an_artifact_of_other_weights(llama, tmp_path):
    """The check is not vacuous: the graph written from one folder, judged against another folder of
    the same shapes but other weights, misses at fp32 (and its logits are far in cosine)."""
    from modelport.parsers.hf_decoder_config import read_decoder_config
    from modelport.parsers.hf_decoder_graph import write_decoder
    from modelport.validation.generation import GenerationBudget, fixed_prompts
    from modelport.validation.streamed_reference import judge_streamed

    other = build("llama", tmp_path / "other", seed=1)
    cfg = read_decoder_config(llama)
    path = tmp_path / "graph" / "model.onnx"
    path.parent.mkdir()
    write_decoder(llama, cfg, path)
    prompts = fixed_prompts(cfg.vocab_size, avoid=(cfg.safe_pad,))
    same, _ = judge_streamed(path, llama, prompts, 4, cfg.safe_pad, hop="same")
    assert same.ok and same.tokens == 1.0
    wrong, _ = judge_streamed(path, other, prompts, 4, cfg.safe_pad, hop="other")
    assert not wrong.ok and wrong.details["cosine_min"] < 0.9
    loose, _ = judge_streamed(path, other, prompts, 4, cfg.safe_pad, hop="other", precision="int4",
                              budget=GenerationBudget(min_tokens=0.0, min_cosine=0.9))
    assert not loose.ok and "least logit cosine" in loose.reason


def test_auto_streams_when_the_fp32_model_does_not_fit_and_refuses_below_the_streamed_estimate(cli, deep, tmp_path, monkeypatch):
    """--reference auto (the default): with memory between the streamed route's estimate and the fp32
    reference's, the run streams and skips the fp32 checks (saying why); below the streamed estimate
    it is exit 2 before any work, naming both estimates; the folder stays byte-identical."""
    before = {p.name: p.read_bytes() for p in deep.iterdir()}
    monkeypatch.setenv("MODELPORT_AVAILABLE_MEMORY", "64G")
    r = cli("convert", deep, "--task", "text-generation", "-o", tmp_path / "probe", "--json", "--new-tokens", "2",
            "--reference", "streamed", "--precision", "int4", "--accuracy-budget", "tokens>=0")
    assert r.exit_code == 0, r
    row = _stage(r.json(), "preflight:memory")
    streamed, full = row["estimated_peak_rss"], row["fp32_reference_peak_rss"]
    assert streamed < full
    monkeypatch.setenv("MODELPORT_AVAILABLE_MEMORY", str((streamed + full) // 2))
    out = tmp_path / "out"
    r = cli("convert", deep, "--task", "text-generation", "-o", out, "--json", "--new-tokens", "4", "--precision", "int4",
            "--optimize", "all", "--accuracy-budget", "tokens>=0,cosine>=0.9")
    assert r.exit_code == 0, r
    report = r.json()
    assert _stage(report, "preflight:memory")["reference"] == "streamed"
    assert "does not fit in memory" in _stage(report, "validate:fused")["skipped"]
    assert "validate:ir" not in [s["name"] for s in report["stages"]]  # the fused graph stands for it
    assert "does not fit in memory" in _stage(report, "optimize:decoder-fusion")["checked"]
    g = report["generation"][0]
    assert g["ok"] and g["reference"] == "streamed" and g["cosine_min"] >= 0.9
    monkeypatch.setenv("MODELPORT_AVAILABLE_MEMORY", str(streamed - 1))
    r = cli("convert", deep, "--task", "text-generation", "-o", tmp_path / "short", "--precision", "int4")
    assert r.exit_code == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "the artifact's onnxruntime session, with the reference streamed" in lines[0]
    assert "the fp32 reference would need" in lines[0] and not (tmp_path / "short").exists()
    r = cli("convert", deep, "--task", "text-generation", "-o", tmp_path / "short", "--precision", "int4", "--reference", "transformers")
    assert r.exit_code == 2 and "held in fp32 by the transformers reference; the streamed reference would need" in r.stderr, r
    assert {p.name: p.read_bytes() for p in deep.iterdir()} == before


def test_a_7b_decoder_streams_within_20_gib_where_the_fp32_reference_cannot(tmp_path):
    """The estimate at Qwen2.5-7B's shapes (bench/llm_scale.py --preset 7b), from its config alone:
    the fp32 reference's route needs more than a 24 GiB machine has, the streamed int4 route less
    than 20 GiB; fp32 artifacts stream no better (their own session holds 4 bytes a weight)."""
    from types import SimpleNamespace

    from modelport.orchestration.text_generation import estimate_peak, streamed_peak

    cfg = SimpleNamespace(vocab_size=152064, hidden_size=3584, num_layers=28, tied_embeddings=False)
    layer = 2 * 3584 * 3584 + 2 * 512 * 3584 + 3 * 3584 * 18944  # q and o, k and v (4 heads of 128), the MLP
    parameters = 28 * layer + 2 * 152064 * 3584
    assert 7.5e9 < parameters < 7.7e9

    def run(precision):
        return SimpleNamespace(precision=precision, options=SimpleNamespace(level=None),
                               tg=SimpleNamespace(block_size=32, symmetric=True))

    assert estimate_peak(parameters, run("int4"), written=True) > 24 * 2**30
    assert streamed_peak(cfg, parameters, run("int4")) < 20 * 2**30
    assert streamed_peak(cfg, parameters, run("fp32")) > 24 * 2**30


def _sparse_folder(folder: Path, **config) -> Path:
    """A Qwen2 folder whose safetensors header declares full-size bf16 tensors over a sparse file:
    the checkpoint's size on paper, none of it on disk (the preflight reads headers only)."""
    import struct

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**config, architectures=["Qwen2ForCausalLM"])
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    header, offset = {}, 0
    for name, p in model.named_parameters():
        size = 2 * p.numel()
        header[name] = {"dtype": "BF16", "shape": list(p.shape), "data_offsets": [offset, offset + size]}
        offset += size
    folder.mkdir(parents=True)
    cfg.save_pretrained(folder)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = folder / "model.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return folder


def test_a_run_whose_scratch_would_not_fit_on_its_disk_is_exit_2_before_work(tmp_path):
    """The fp32 graph, the quantised one and the artifacts are counted against the free space of the
    scratch folder's and the output's disks before any work: a folder too large is exit 2 naming
    both figures and TMPDIR, with nothing written. (A subprocess: the `cli` fixture would hash the
    sparse checkpoint's 145 GB of zeros to prove it unchanged.)"""
    import os
    import subprocess
    import sys

    folder = _sparse_folder(tmp_path / "huge", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                            num_attention_heads=64, num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False)
    before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}
    env = {**os.environ, "MODELPORT_AVAILABLE_MEMORY": "100T", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "modelport", "convert", str(folder), "--task", "text-generation", "-o",
                        str(tmp_path / "out"), "--precision", "int4", "--json"], capture_output=True, text=True, env=env,
                       cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "of disk in" in lines[0] and "fp32 graph and the artifacts" in lines[0] and "TMPDIR" in lines[0]
    row = json.loads(r.stdout)["stages"][0]
    assert row["name"] == "preflight:memory" and row["parameters"] > 70e9
    assert row["disk"][0]["needed"] > row["disk"][0]["free"]
    assert not (tmp_path / "out").exists()
    assert {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()} == before


def test_auto_streams_from_a_billion_parameters_even_when_the_fp32_model_fits(tmp_path):
    """A 1.1 B folder (a sparse checkpoint, nothing loaded): with memory for the fp32 reference,
    --reference auto still takes the streamed one (faster from that size on); the preflight row says
    so, and with too little memory the refusal names the streamed route's estimate."""
    import os
    import subprocess
    import sys

    from modelport.orchestration.text_generation import STREAM_FROM

    folder = _sparse_folder(tmp_path / "b1", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                            num_attention_heads=16, num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False)

    def preflight(memory: str, *extra: str):
        env = {**os.environ, "MODELPORT_AVAILABLE_MEMORY": memory, "HF_HUB_OFFLINE": "1"}
        return subprocess.run([sys.executable, "-m", "modelport", "convert", str(folder), "--task", "text-generation", "-o",
                               str(tmp_path / "out"), "--precision", "int4", "--json", *extra], capture_output=True, text=True,
                              env=env, cwd=Path(__file__).resolve().parents[2], timeout=300)

    r = preflight("1G")  # below every estimate: the refusal says which route was taken
    assert r.returncode == 2, r.stderr
    row = json.loads(r.stdout)["stages"][0]
    assert STREAM_FROM <= row["parameters"] < 2 * STREAM_FROM
    assert row["reference"] == "streamed" and row["estimated_peak_rss"] < row["fp32_reference_peak_rss"] < 64 << 30
    assert "with the reference streamed" in r.stderr
    r = preflight("1G", "--reference", "transformers")
    assert r.returncode == 2 and json.loads(r.stdout)["stages"][0]["reference"] == "transformers", r.stderr
    assert not (tmp_path / "out").exists()
