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
    assert [s["name"] for s in report["stages"]][:4] == ["preflight:memory", "parse", "reference:generate", "validate:ir"]
    # the same pipeline as every other conversion: one preflight of every target's routes, then each job's
    # emit and validate stages, and artifact entries written by the same chain (route, requested precision)
    names = [s["name"] for s in report["stages"]]
    assert names[names.index("preflight"):] == ["preflight", "emit:onnx", "validate:onnx", "emit:ort-genai", "validate:ort-genai"]
    assert all(a["route"] == "onnx" and a["requested_precision"] == "fp32" for a in report["artifacts"])
    assert all(s["peak_rss"] > 0 for s in report["stages"]) and report["peak_rss"] == max(s["peak_rss"] for s in report["stages"])
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


def test_int4_of_a_tied_model_reads_its_embedding_from_the_quantised_output_projection(cli, tmp_path):
    """Qwen2 ties its embedding to the output projection: the int4 artifacts hold that matrix once,
    quantised (GatherBlockQuantized over the projection's MatMulNBits weight, as onnxruntime-genai's
    builder writes it), with no float table left, and both still generate (onnxruntime-genai what our
    loop generates)."""
    import onnx

    src = build("qwen2", tmp_path / "src" / "qwen2")
    out = tmp_path / "out"
    r = cli("convert", src, "--task", "text-generation", "--to", "onnx,ort-genai", "-o", out, "--json", "--precision", "int4",
            "--block-size", "16", "--optimize", "all", "--accuracy-budget", "tokens>=0.0", "--new-tokens", "12")
    assert r.exit_code == 0, r
    report = r.json()
    quant = next(s for s in report["stages"] if s["name"] == "quantize:int4")
    assert quant["embedding"] == "read from the quantised output projection (GatherBlockQuantized)"
    config = json.loads((src / "config.json").read_text())
    tables = ([config["vocab_size"], config["hidden_size"]], [config["hidden_size"], config["vocab_size"]])
    for path in (out / "model.onnx", out / "ort-genai" / "model.onnx"):
        model = onnx.load(str(path))
        ops = [n.op_type for n in model.graph.node]
        assert ops.count("GatherBlockQuantized") == 1 and "Gather" not in [n.op_type for n in model.graph.node
                                                                            if n.input and n.input[-1] == "input_ids"]
        assert not [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and list(t.dims) in tables]
    gens = report["generation"]
    assert all(g["ok"] for g in gens) and gens[1]["runtime_agreement"] == 1.0


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


def test_fp16_onnx_and_ort_genai_in_float16_within_the_default_budget(cli, llama, tmp_path):
    """fp16: the fused graph written again in float16 (weights, cache, logits), half the fp32 weights'
    bytes; both artifacts judged against the fp32 reference by the default budget, and
    onnxruntime-genai generating from the folder what our loop generates."""
    import onnx

    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "--to", "onnx,ort-genai", "-o", out, "--json",
            "--precision", "fp16", "--optimize", "all", "--new-tokens", "16")
    assert r.exit_code == 0, r
    report = r.json()
    _schema_ok(report)
    names = [s["name"] for s in report["stages"]]
    assert names.index("validate:fused") < names.index("precision:fp16") < names.index("emit:onnx")
    row = next(s for s in report["stages"] if s["name"] == "precision:fp16")
    assert row["form"] == "fused" and row["dtype"] == "float16" and "clamped" not in row
    model = onnx.load(str(out / "model.onnx"))
    T = onnx.TensorProto
    assert {o.type.tensor_type.elem_type for o in model.graph.output} == {T.FLOAT16}
    assert {i.type.tensor_type.elem_type for i in model.graph.input[3:]} == {T.FLOAT16}
    assert {t.data_type for t in model.graph.initializer if t.data_type in (T.FLOAT, T.FLOAT16)} == {T.FLOAT16}
    assert any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    assert [a["precision"] for a in report["artifacts"]] == ["fp16", "fp16"]
    gens = report["generation"]
    assert [g["precision"] for g in gens] == ["fp16", "fp16"]
    assert all(g["ok"] and g["budget"] == "tokens>=0.9" and g["token_agreement"] >= 0.9 and g["max_abs"] < 0.05 for g in gens)
    assert gens[1]["runtime_agreement"] == 1.0


def test_fp16_of_a_family_the_writer_does_not_cover_is_exit_2_before_work(cli, tmp_path):
    folder = build("phi3", tmp_path / "src" / "phi3")
    r = cli("convert", folder, "--task", "text-generation", "-o", tmp_path / "out", "--precision", "fp16")
    assert r.exit_code == 2, r
    assert "--precision fp16 is written for llama, mistral, qwen2, qwen3 decoders; this one has family phi3" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_missed_budget_is_exit_4_and_leaves_nothing(cli, llama, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "-o", out, "--precision", "int4",
            "--accuracy-budget", "tokens>=1.0,max_abs<=1e-9", "--new-tokens", "4")
    assert r.exit_code == 4, r
    assert "worst logit error" in r.stderr and "budget tokens>=1, max_abs<=1e-09" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,message", [
    (["--to", "tflite"], "writes onnx, ort-genai; not tflite"),
    (["--precision", "uint8"], "takes --precision fp32, fp16, int8, int4 or auto; not uint8"),
    (["--precision", "fp16", "--optimize", "auto"], "--optimize auto times its variants on the CPU, where fp16 is not meant"),
    (["--accuracy-budget", "atol<=0.9"], "bad --accuracy-budget 'atol<=0.9' for text generation"),
    (["--reference", "fp64"], "unknown --reference 'fp64'; known: auto, transformers, streamed"),
    (["--reference", "streamed", "--optimize", "auto"], "--optimize auto judges its variants against the transformers reference"),
    (["--block-size", "48"], "bad --block-size 48"),
    (["--optimize", "basic"], "takes --optimize none, all or auto; not basic"),
    (["--precision", "auto"], "--precision auto lets --optimize auto pick among fp32, int8, int4"),
    (["--precision", "auto", "--optimize", "all"], "--precision auto lets --optimize auto pick"),
    (["--optimize", "auto", "--runtimes", "openvino"], "--optimize auto times onnxruntime variants; not --runtimes openvino"),
])
def test_requests_the_route_cannot_deliver_are_exit_2_before_work(cli, llama, tmp_path, args, message):
    r = cli("convert", llama, "--task", "text-generation", "-o", tmp_path / "out", *args)
    assert r.exit_code == 2, r
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_folder_too_large_for_the_memory_available_is_exit_2_before_work(cli, llama, tmp_path, monkeypatch):
    """The route's peak is estimated from the safetensors headers before anything loads: more than
    the memory available is exit 2 naming both figures and how to run anyway, with no output left
    and the folder untouched; enough memory runs and records both figures in the preflight row."""
    from modelport.orchestration.text_generation import LIBRARIES

    before = {p.name: p.read_bytes() for p in llama.iterdir()}
    monkeypatch.setenv("MODELPORT_AVAILABLE_MEMORY", "300M")  # below the libraries alone
    r = cli("convert", llama, "--task", "text-generation", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(llama) in lines[0], r.stderr
    assert "converting needs about 1.3 GB of memory" in lines[0] and "315 MB is available" in lines[0]
    assert "MODELPORT_AVAILABLE_MEMORY=<bytes> to run anyway" in lines[0]
    assert r.json()["exit_code"] == 2 and [s["name"] for s in r.json()["stages"]] == ["preflight:memory"]
    assert not (tmp_path / "out").exists() and {p.name: p.read_bytes() for p in llama.iterdir()} == before
    monkeypatch.setenv("MODELPORT_AVAILABLE_MEMORY", "64G")
    r = cli("convert", llama, "--task", "text-generation", "-o", tmp_path / "out", "--json", "--new-tokens", "2")
    assert r.exit_code == 0, r
    row = r.json()["stages"][0]
    from safetensors import safe_open

    with safe_open(str(llama / "model.safetensors"), "np") as f:
        params = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())  # noqa: SIM118 (safe_open is no dict)
    assert row["name"] == "preflight:memory" and row["parameters"] == params and row["available_memory"] == 64 << 30
    assert LIBRARIES < row["estimated_peak_rss"] < LIBRARIES + 10 * 4 * params


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


def test_large_artifacts_keep_their_weights_in_a_data_file(llama, tmp_path, monkeypatch):
    """Past DECODER_EXTERNAL_BYTES (emitters/onnx.py) the artifacts' weights go to model.onnx.data (onnxruntime then does not
    hold a whole single-file model while it builds a session); they generate as before."""
    import modelport
    from modelport.emitters import onnx as onnx_emitter
    from modelport.orchestration import text_generation

    monkeypatch.setattr(onnx_emitter, "DECODER_EXTERNAL_BYTES", 1 << 16)  # the tiny model's weights are past it
    options = modelport.ConvertOptions(task="text-generation", targets=["onnx", "ort-genai"],
                                       text_generation=text_generation.TextGenerationOptions(new_tokens=4))
    report = modelport.convert(llama, tmp_path / "out", options=options)
    assert report["status"] == "ok" and [g["token_agreement"] for g in report["generation"]] == [1.0, 1.0]
    files = {f for a in report["artifacts"] for f in a["files"]}
    assert {"model.onnx", "model.onnx.data", "ort-genai/model.onnx", "ort-genai/model.onnx.data"} <= files
    assert (tmp_path / "out" / "model.onnx.data").stat().st_size > 1 << 16


def test_precision_auto_needs_the_text_generation_task(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "-o", tmp_path / "out", "--precision", "auto", "--optimize", "auto")
    assert r.exit_code == 2 and "--precision auto is for --task text-generation --optimize auto" in r.stderr
    assert not (tmp_path / "out").exists()


def fake_decode_timer(decode_tok_s: dict[str, list[float]], prefill_ms: float = 5.0):
    """Decode tokens/s per variant and round (a list: one per round; else 100); each variant still generates once
    per call, so a variant that cannot run would show. `timer.seen` lists (variant, round) in call order."""
    seen = []

    def timer(row, run):
        got = run()
        assert got["prefill_ms"] > 0 and got["decode_tok_s"] > 0
        seen.append((row["variant"], row["round"]))
        figures = decode_tok_s.get(row["variant"], [100.0] * (row["round"] + 1))
        return {"prefill_ms": prefill_ms, "decode_tok_s": figures[row["round"]]}

    timer.seen = seen
    return timer


def _auto_convert(llama, out, timer, *, precision="fp32", budget=None, targets=("onnx",)):
    import modelport
    from modelport.optimize.decoder_auto import DecoderAutoOptions
    from modelport.optimize.pipeline import OptimizeOptions
    from modelport.orchestration.text_generation import TextGenerationOptions

    tg = TextGenerationOptions(new_tokens=8, budget=budget, auto=DecoderAutoOptions(prompt_tokens=16, decode_steps=4, timer=timer))
    options = modelport.ConvertOptions(task="text-generation", precision=precision, targets=list(targets),
                                       optimize=OptimizeOptions(level="auto"), text_generation=tg)
    return modelport.convert(llama, out, options=options)


def test_auto_keeps_the_fused_variant_when_it_decodes_fastest_by_the_median(llama, tmp_path):
    """Five interleaved rounds; fused is faster by the median (210 > 200) though slower by the mean."""
    timer = fake_decode_timer({"fp32": [200.0] * 5, "fp32-fused": [210.0, 1.0, 210.0, 1.0, 210.0]})
    report = _auto_convert(llama, tmp_path / "out", timer, targets=("onnx", "ort-genai"))
    assert timer.seen == [(v, r) for r in range(5) for v in ("fp32", "fp32-fused")]  # interleaved round by round
    stage = next(s for s in report["stages"] if s["name"] == "optimize:auto")
    by = {v["variant"]: v for v in stage["variants"]}
    assert list(by) == ["fp32", "fp32-fused"] and stage["chosen"] == "fp32-fused" and stage["ranked_by"] == "decode_tok_s"
    assert by["fp32-fused"]["chosen"] and not by["fp32"]["chosen"] and by["fp32"]["reason"] == "decodes slower than fp32-fused"
    assert by["fp32-fused"]["decode_tok_s"] == 210.0 and by["fp32-fused"]["decode_speedup"] == 1.05
    assert by["fp32-fused"]["fused"] and by["fp32-fused"]["nodes"] < by["fp32"]["nodes"] and stage["fusion"]["fused"]
    for v in by.values():
        assert v["within_budget"] and v["token_agreement"] == 1.0 and v["max_abs"] < 1e-4 and v["prefill_ms"] == 5.0
    assert [(a["target"], a["variant"], a["precision"]) for a in report["artifacts"]] == [("onnx", "fp32-fused", "fp32"),
                                                                                          ("ort-genai", "fp32-fused", "fp32")]
    import onnx

    ops = [n.op_type for n in onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node]
    assert "GroupQueryAttention" in ops  # the fused variant is what was written, and it generated like transformers
    assert all(g["ok"] and g["token_agreement"] == 1.0 for g in report["generation"])
    _schema_ok(report)


def test_auto_never_keeps_a_faster_variant_outside_the_budget(llama, tmp_path):
    """--precision auto: int4 decodes fastest but misses max_abs<=0.03 (its worst logit error is ~0.09 on this
    model, int8's ~0.009): the fastest variant within the budget, int8-fused, is written; the table shows why."""
    fast = {"int4-fused": [1000.0] * 5, "int4": [900.0] * 5, "int8-fused": [500.0] * 5, "int8": [400.0] * 5}
    report = _auto_convert(llama, tmp_path / "out", fake_decode_timer(fast), precision="auto", budget="tokens>=0.5,max_abs<=0.03")
    stage = next(s for s in report["stages"] if s["name"] == "optimize:auto")
    rows = {v["variant"]: v for v in stage["variants"]}
    assert list(rows) == ["fp32", "fp32-fused", "int8", "int8-fused", "int4", "int4-fused"]
    assert stage["chosen"] == "int8-fused" and [v for v in rows if rows[v]["chosen"]] == ["int8-fused"]
    for name in ("int4", "int4-fused"):
        assert not rows[name]["within_budget"] and "budget tokens>=0.5, max_abs<=0.03" in rows[name]["reason"]
        assert rows[name]["max_abs"] > 0.03 and rows[name]["decode_tok_s"] > rows["int8-fused"]["decode_tok_s"]
    for row in rows.values():
        assert {"variant", "precision", "fused", "prefill_ms", "decode_tok_s", "token_agreement", "max_abs", "within_budget",
                "chosen", "reason", "budget"} <= set(row)
    assert rows["fp32"]["budget"].startswith("identical tokens") and rows["int8"]["budget"] == "tokens>=0.5, max_abs<=0.03"
    (art,) = report["artifacts"]
    assert (art["variant"], art["precision"], art["requested_precision"]) == ("int8-fused", "int8", "auto")
    (g,) = report["generation"]
    assert g["precision"] == "int8" and g["ok"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert "auto: decode speed against accuracy" in html and "int4-fused" in html and "<b>chosen</b>" in html
    _schema_ok(report)


def test_auto_with_the_wall_clock_on_the_cli(cli, llama, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "-o", out, "--optimize", "auto", "--precision", "int8",
            "--new-tokens", "4")
    assert r.exit_code == 0, r
    assert "auto: chose int8" in r.stderr and "int8-fused" in r.stderr and "prefill" in r.stderr  # the table it chose from
    report = json.loads((out / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "optimize:auto")
    assert [v["variant"] for v in stage["variants"]] == ["int8", "int8-fused"]
    assert stage["prompt_tokens"] == 128 and stage["decode_steps"] == 32 and stage["rounds"] == 5
    passing = [v for v in stage["variants"] if v["within_budget"]]
    assert passing and all(v["prefill_ms"] > 0 and v["decode_tok_s"] > 0 for v in stage["variants"])
    assert stage["chosen"] == max(passing, key=lambda v: v["decode_tok_s"])["variant"]
    assert report["artifacts"][0]["variant"] == stage["chosen"] and report["artifacts"][0]["precision"] == "int8"
    assert report["generation"][0]["ok"]


def test_auto_with_no_variant_within_its_check_is_exit_4_and_leaves_nothing(cli, llama, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "-o", out, "--optimize", "auto", "--precision", "int4",
            "--accuracy-budget", "tokens>=1.0,max_abs<=1e-9", "--new-tokens", "4")
    assert r.exit_code == 4, r
    assert "no variant passes its generation check" in r.stderr and "int4-fused: token agreement" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("family", ["mistral", "gemma", "gemma2", "qwen3"])
def test_each_family_generates_through_convert_and_onnxruntime_genai(cli, family, tmp_path):
    """Mistral and Gemma2 with a sliding window of 4 (shorter than prompt + 16 tokens), Gemma with
    head_dim 24 over hidden 64 / 4 heads and tied embeddings, Qwen3 with q/k norms: the KV-cache
    model and onnxruntime-genai's own search both generate transformers' tokens."""
    from modelport.parsers.hf_decoder_config import FAMILIES

    src = build(family, tmp_path / "src" / family)
    out = tmp_path / "out"
    r = cli("convert", src, "--task", "text-generation", "--to", "onnx,ort-genai", "-o", out, "--json", "--new-tokens", "16")
    assert r.exit_code == 0, r
    report = r.json()
    _schema_ok(report)
    assert next(s for s in report["stages"] if s["name"] == "parse")["family"] == family
    gens = {g["hop"].split("→")[1].split(" ")[0]: g for g in report["generation"]}
    assert set(gens) == {"onnx", "ort-genai"}
    for g in gens.values():
        assert g["ok"] and g["token_agreement"] == 1.0 and g["max_abs"] < 1e-4, g
    model = json.loads((out / "ort-genai" / "genai_config.json").read_text())["model"]
    source = json.loads((src / "config.json").read_text())
    assert model["type"] == FAMILIES[source["architectures"][0]] == family  # a type onnxruntime-genai knows
    assert model["decoder"]["head_size"] == source.get("head_dim", 16) == (24 if family.startswith("gemma") else 16)
    assert model["decoder"]["num_key_value_heads"] == 2 and model["vocab_size"] == 128


def test_phi3_longrope_converts_for_its_original_context(cli, tmp_path):
    """Phi-3.5-mini's rope layout (longrope, original 4096 of 131072) in small: the model converts
    for the context up to original_max_position_embeddings (here 48 of 256), exactly as transformers
    generates there, fused too; the ort-genai folder stops at it and the report says why. A
    generation that would pass it is refused before any reference is computed."""
    longrope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
                "original_max_position_embeddings": 48}
    src = build("phi3", tmp_path / "src" / "phi3", original_max_position_embeddings=48, rope_parameters=longrope)
    out = tmp_path / "out"
    r = cli("convert", src, "--task", "text-generation", "--to", "onnx,ort-genai", "--optimize", "all", "-o", out,
            "--json", "--new-tokens", "24")
    assert r.exit_code == 0, r
    report = r.json()
    assert all(g["ok"] and g["token_agreement"] == 1.0 for g in report["generation"])
    assert any(w.startswith("context limited to 48 of 256 tokens") for w in report["warnings"])
    fusion = next(s for s in report["stages"] if s["name"] == "optimize:decoder-fusion")
    assert fusion["kept"] and fusion["fused"]["GroupQueryAttention"] == 2
    genai = json.loads((out / "ort-genai" / "genai_config.json").read_text())
    assert genai["model"]["context_length"] == 48 and genai["search"]["max_length"] == 48

    r = cli("convert", src, "--task", "text-generation", "-o", tmp_path / "long", "--new-tokens", "45")
    assert r.exit_code == 2 and "--new-tokens 45 with a 7-token prompt passes the model's context of 48 tokens" in r.stderr
    assert not (tmp_path / "long").exists()


def _perturbed_fusion(monkeypatch):
    """Replace the fusion by the real one with noise (std 0.05) added to its largest weight: a real
    fused model that onnxruntime runs, which generates differently from the source."""
    import onnx
    from onnx import numpy_helper

    from modelport.onnxfile.onnx_io import save_onnx
    from modelport.orchestration import decoder_variants

    real = decoder_variants.fused_model

    def fuse_and_perturb(ir, cfg, path, export):
        details = real(ir, cfg, path, export)
        fused = onnx.load(str(path))
        init = max(fused.graph.initializer, key=lambda t: np.prod(t.dims) if t.data_type == 1 else 0)
        w = numpy_helper.to_array(init)
        noise = np.random.default_rng(0).normal(0, 0.05, w.shape).astype(np.float32)
        init.CopyFrom(numpy_helper.from_array(w + noise, init.name))
        save_onnx(fused, path, external=True)
        return details

    monkeypatch.setattr(decoder_variants, "fused_model", fuse_and_perturb)


@pytest.mark.parametrize("reference", ["transformers", "streamed"])
def test_a_fusion_that_changes_generation_is_rolled_back(cli, llama, tmp_path, monkeypatch, reference):
    """Streamed: the fused graph misses on the prefill, so the export is checked after it (and passes)."""
    _perturbed_fusion(monkeypatch)
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "-o", out, "--json", "--new-tokens", "8", "--optimize", "all",
            "--reference", reference)
    assert r.exit_code == 0, r
    report = r.json()
    _schema_ok(report)
    names = [s["name"] for s in report["stages"]]
    if reference == "streamed":
        assert names.index("validate:fused") < names.index("validate:ir")
        assert next(s for s in report["stages"] if s["name"] == "validate:ir")["ok"]
    row = next(s for s in report["stages"] if s["name"] == "optimize:decoder-fusion")
    assert row["kept"] is False and row["reason"] and row["max_abs"] > 1e-3
    assert row["fused"]["GroupQueryAttention"] == 2 and row["nodes"] < row["nodes_before"]  # the fusion did happen
    assert f"decoder fusion rolled back: {row['reason']}" in report["warnings"]
    import onnx

    artifact = onnx.load(str(out / "model.onnx"))
    ops = {n.op_type for n in artifact.graph.node}
    assert len(artifact.graph.node) == row["nodes_before"]  # the unfused IR, as exported
    assert not ops & {"MultiHeadAttention", "GroupQueryAttention", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
    assert all(n.domain in ("", "ai.onnx") for n in artifact.graph.node)
    (g,) = report["generation"]
    assert g["ok"] and g["token_agreement"] == 1.0 and g["max_abs"] < 1e-4


def test_a_fusion_that_changes_generation_fails_under_strict(cli, llama, tmp_path, monkeypatch):
    _perturbed_fusion(monkeypatch)
    out = tmp_path / "out"
    r = cli("convert", llama, "--task", "text-generation", "-o", out, "--new-tokens", "8", "--optimize", "all", "--strict")
    assert r.exit_code == 4, r
    assert "decoder fusion breaks generation: " in r.stderr and "(--strict)" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _tree_digest(folder: Path) -> dict:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _gpt_neox(folder: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=256)
    transformers.GPTNeoXForCausalLM(config).save_pretrained(str(folder))


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _broken(case: str, folder: Path) -> None:
    """A folder modelport cannot export faithfully, as users meet them."""
    if case == "gpt-neox":
        _gpt_neox(folder)
    elif case == "made-up":
        build("llama", folder)
        _edit_config(folder, architectures=["ZebraForCausalLM"], model_type="zebra")
    elif case == "untied-without-lm-head":  # a tied checkpoint whose config was edited to untie: lm_head would be random
        build("llama-tied", folder)
        _edit_config(folder, tie_word_embeddings=False)
    elif case == "config-of-another-size":
        build("llama", folder)
        _edit_config(folder, intermediate_size=96)
    elif case == "dynamic-rope":
        build("llama", folder, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0})


@pytest.mark.parametrize("case,reason", [
    ("gpt-neox", "architecture 'GPTNeoXForCausalLM' is not a supported text-generation family"),
    ("made-up", "architecture 'ZebraForCausalLM' is not a supported text-generation family"),
    ("untied-without-lm-head", "the weights do not fit config.json: no lm_head.weight in the weights"),
    ("config-of-another-size", "the weights do not fit config.json: model.layers.0.mlp.down_proj.weight is [64, 128] in the "
                               "weights but [64, 96] by the config (6 tensors differ)"),
    ("dynamic-rope", "rope type 'dynamic' is not supported"),
])
def test_a_folder_that_cannot_be_exported_is_exit_2_with_one_line_and_no_output(cli_proc, case, reason, tmp_path):
    """Through the real CLI process: one line on stderr naming the folder and the reason, exit 2,
    no output folder (nor anything else beside it), the input folder byte-identical."""
    src = tmp_path / "src" / case
    _broken(case, src)
    before = _tree_digest(src)
    out = tmp_path / "out"
    r = cli_proc("convert", src, "--task", "text-generation", "--to", "onnx,ort-genai", "-o", out)
    assert r.exit_code == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(src) in lines[0] and reason in lines[0], r.stderr
    assert r.stdout == ""
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert _tree_digest(src) == before
