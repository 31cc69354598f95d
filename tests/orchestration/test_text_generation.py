"""`convert --task text-generation` end to end on a tiny Llama-style folder: the KV-cache model and
the onnxruntime-genai folder generate what transformers generates; int8/int4 report token agreement
and logit error against the budget; refusals are exit 2 (or 4 for a missed budget) with no output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.hf_folders import build

SCHEMA = Path(__file__).resolve().parents[2] / "src/modelport/validation/report.schema.json"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build("llama", tmp_path_factory.mktemp("src") / "llama")


def _schema_ok(report: dict) -> None:
    import jsonschema

    jsonschema.validate(report, json.loads(SCHEMA.read_text()))


def test_fp32_onnx_and_ort_genai_generate_like_transformers(cli, llama, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "--to", "onnx,ort-genai", "-o", out, "--json", "--new-tokens", "16",
            "--optimize", "all")
    assert r.exit_code == 0, r
    report = r.json()
    _schema_ok(report)
    fusion = next(s for s in report["stages"] if s["name"] == "optimize:decoder-fusion")
    assert fusion["kept"] and fusion["nodes"] < fusion["nodes_before"]
    # 2 layers: RMSNorm at the first layer's input, 2 per layer and the final one, 4 of them after a residual Add;
    # attention as GroupQueryAttention (rotary inside, packed q/k/v) on the un-expanded cache
    assert fusion["fused"] == {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 4, "GroupQueryAttention": 2}
    assert fusion["group_query_attention"]["fused"] == [0, 1] and fusion["group_query_attention"]["packed_qkv"] == 2
    import onnx

    nodes = onnx.load(str(out / "model.onnx")).graph.node
    ops = [n.op_type for n in nodes]
    assert ops.count("GroupQueryAttention") == 2 and ops.count("SkipSimplifiedLayerNormalization") == 4
    assert "MultiHeadAttention" not in ops and not [n for n in nodes if any(i.startswith("present.") for i in n.input)]
    gens = {g["hop"].split("→")[1].split(" ")[0]: g for g in report["generation"]}
    assert set(gens) == {"onnx", "ort-genai"}
    for g in gens.values():
        assert g["ok"] and g["token_agreement"] == 1.0 and g["max_abs"] < 1e-4 and g["new_tokens"] == 16 and g["prompts"] == 3
    assert [s["name"] for s in report["stages"]][:3] == ["parse", "validate:ir", "reference:generate"]
    assert report["parity"][0]["ok"]
    folder = out / "ort-genai"
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["decoder"]["num_key_value_heads"] == 2 and config["model"]["type"] == "llama"
    assert config["search"]["past_present_share_buffer"] is True  # GroupQueryAttention writes into the shared buffer
    assert (folder / "tokenizer.json").is_file() and (out / "model.onnx").is_file()

    # the folder as a user loads it: onnxruntime-genai's tokenizer and search, against our own loop
    import onnxruntime_genai as og

    from modelport.validation.generation import generate_onnx

    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    prompt = [int(t) for t in tokenizer.encode("the cat sat on")]
    assert tokenizer.decode(np.array(prompt, dtype=np.int32)) == "the cat sat on"
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 12, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt], dtype=np.int32))
    theirs = []
    while not gen.is_done():
        gen.generate_next_token()
        theirs.append(int(gen.get_next_tokens()[0]))
    ours = generate_onnx(out / "model.onnx", [prompt], 12, pad=0).tokens[0].tolist()
    assert theirs and theirs == ours[:len(theirs)]
    assert len(theirs) == 12 or theirs[-1] == 2  # ran to max_length, or stopped at the end-of-sequence id


def test_int4_reports_token_agreement_and_logit_error(cli, llama, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "-o", out, "--json", "--precision", "int4", "--block-size", "16",
            "--asymmetric", "--accuracy-budget", "tokens>=0.0", "--new-tokens", "12")
    assert r.exit_code == 0, r
    report = r.json()
    _schema_ok(report)
    quant = next(s for s in report["stages"] if s["name"] == "quantize:int4")
    assert quant["bits"] == 4 and quant["block_size"] == 16 and quant["symmetric"] is False and quant["quantized"] > 0
    import onnx

    ops = [n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node]
    assert ops.count("MatMulNBits") == quant["quantized"]
    (g,) = report["generation"]
    assert g["precision"] == "int4" and g["ok"] and g["budget"] == "tokens>=0"
    assert 0.0 <= g["token_agreement"] <= 1.0 and 0 < g["max_abs"] < 10
    assert report["artifacts"][0]["precision"] == "int4"


def test_int8_onnx_and_ort_genai_within_the_default_budget(cli, llama, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "--to", "onnx,ort-genai", "-o", out, "--json",
            "--precision", "int8", "--new-tokens", "16")
    assert r.exit_code == 0, r
    gens = r.json()["generation"]
    assert [g["precision"] for g in gens] == ["int8", "int8"]
    assert all(g["budget"] == "tokens>=0.9" and g["token_agreement"] >= 0.9 for g in gens)
    assert 0 < gens[0]["max_abs"] < 1 and 0 <= gens[0]["free_running_agreement"] <= 1
    assert gens[1]["runtime_agreement"] == 1.0  # onnxruntime-genai generates what our loop generates on the same file


def test_a_missed_budget_is_exit_4_and_leaves_nothing(cli, llama, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "-o", out, "--precision", "int4",
            "--accuracy-budget", "tokens>=1.0,max_abs<=1e-9", "--new-tokens", "4")
    assert r.exit_code == 4, r
    assert "worst logit error" in r.stderr and "budget tokens>=1, max_abs<=1e-09" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,message", [
    (["--to", "tflite"], "writes onnx, ort-genai; not tflite"),
    (["--precision", "fp16"], "takes --precision fp32, int8, int4"),
    (["--accuracy-budget", "cosine>=0.9"], "bad --accuracy-budget 'cosine>=0.9' for text generation"),
    (["--block-size", "48"], "bad --block-size 48"),
    (["--optimize", "auto"], "takes --optimize none or all; not auto"),
])
def test_requests_the_route_cannot_deliver_are_exit_2_before_work(cli, llama, tmp_path, args, message):
    r = cli("convert", llama, "--task", "text-generation", "-o", tmp_path / "out", *args)
    assert r.exit_code == 2, r
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


def test_unsupported_family_is_exit_2_with_one_line(cli, tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    r = cli("convert", folder, "--task", "text-generation", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "GPT2LMHeadModel" in lines[0] and "not a supported text-generation family" in lines[0]
    assert not (tmp_path / "out").exists()


def test_int4_needs_the_text_generation_task(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "-o", tmp_path / "out", "--precision", "int4")
    assert r.exit_code == 2 and "--task text-generation" in r.stderr


def test_a_decoder_folder_takes_the_generation_route_without_task(cli, llama, tmp_path):
    """A `...ForCausalLM` folder is text generation by its config: no --task needed."""
    r = cli("convert", llama, "-o", tmp_path / "out", "--new-tokens", "4", "--json")
    assert r.exit_code == 0, r
    assert r.json()["generation"] and {"past_key_values.0.key", "input_ids"} <= {i["name"] for i in r.json()["contract"]["inputs"]}


def test_python_api(llama, tmp_path):
    import modelport
    from modelport.orchestration.text_generation import TextGenerationOptions

    options = modelport.ConvertOptions(task="text-generation", text_generation=TextGenerationOptions(new_tokens=4))
    report = modelport.convert(llama, tmp_path / "out", options=options)
    assert report["status"] == "ok" and report["generation"][0]["token_agreement"] == 1.0
