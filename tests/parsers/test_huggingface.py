"""Hugging Face model folders: random-init tiny transformers models saved with `save_pretrained`,
converted through the CLI with the task given or inferred, each output validated against
transformers in eager mode; safety refusals, wrong tasks, companion files and `inspect`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import transformers

from modelport.errors import BadInputError
from modelport.parsers import hf_folder, hf_loading, hf_tasks

BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
            max_position_embeddings=64)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", "hello", "world"]


def save(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


def converted(cli, folder: Path, out: Path, *args) -> dict:
    r = cli("convert", folder, "-o", out, "--json", *args)
    assert r.exit_code == 0, r
    report = r.json()
    assert report["status"] == "ok" and all(hop["ok"] for hop in report["parity"])
    return report


def run_onnx(path: Path, feeds: dict) -> list:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    """BertForSequenceClassification with a tokenizer (vocab.txt, tokenizer.json, tokenizer_config.json)."""
    folder = tmp_path_factory.mktemp("bert") / "model"
    save(transformers.BertForSequenceClassification(transformers.BertConfig(**BERT, num_labels=3)), folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    return folder


# --- the task table and inference (no model loaded) ----------------------------------------------------


@pytest.mark.parametrize(("arch", "task"), [
    ("BertForSequenceClassification", "text-classification"), ("BertModel", "feature-extraction"),
    ("ViTForImageClassification", "image-classification"), ("SegformerForSemanticSegmentation", "image-segmentation"),
    ("Wav2Vec2ForSequenceClassification", "audio-classification"), ("Wav2Vec2Model", "feature-extraction"),
    ("WhisperEncoder", "feature-extraction"), ("T5ForConditionalGeneration", "text2text-generation"),
    ("WhisperForConditionalGeneration", "automatic-speech-recognition"),
    ("BertForQuestionAnswering", "question-answering"), ("BertForMaskedLM", "fill-mask"),
    ("BertForTokenClassification", "token-classification"), ("LlamaForCausalLM", "text-generation"),
])
def test_task_inferred_from_architecture(arch, task):
    model_type = {"Wav2Vec2ForSequenceClassification": "wav2vec2", "WhisperForConditionalGeneration": "whisper"}.get(arch, "bert")
    assert hf_tasks.infer_task({"model_type": model_type, "architectures": [arch]}, Path("m"), transformers) == task


def test_task_names_and_aliases():
    assert hf_tasks.task_name("text2text") == "text2text-generation"
    assert hf_tasks.task_name("sentiment-analysis") == "text-classification"
    with pytest.raises(BadInputError, match="unknown task 'poetry'; known: feature-extraction"):
        hf_tasks.task_name("poetry")


def test_cli_help_names_real_tasks(cli, tmp_path):
    from modelport.cli.options import HF_TASK_EXAMPLES

    assert set(HF_TASK_EXAMPLES) <= {name for name, t in hf_tasks.TASKS.items() if t.supported}
    r = cli("convert", tmp_path, "--task", "summarise", "-o", tmp_path / "out")
    assert r.exit_code == 2 and f"known: {', '.join(hf_tasks.TASKS)}" in r.stderr


# --- text models --------------------------------------------------------------------------------------


def test_bert_text_classification_inferred_with_tokenizer_files(cli_proc, bert_dir, tmp_path):
    out = tmp_path / "out"
    r = cli_proc("convert", bert_dir, "-o", out, "--json")
    assert r.exit_code == 0, r
    report = json.loads(r.stdout)  # stdout holds the report alone, whatever transformers prints
    assert all(hop["ok"] for hop in report["parity"])
    assert report["source"]["framework"] == "huggingface"
    inputs = {i["name"]: i for i in report["contract"]["inputs"]}
    assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i["shape"] == ["batch", "sequence"] and i["dtype"] == "int64" for i in inputs.values())
    assert inputs["input_ids"]["value_range"] == [0, 100] and inputs["attention_mask"]["value_range"] == [1, 2]
    assert [o["name"] for o in report["contract"]["outputs"]] == ["logits"]
    assert report["contract"]["outputs"][0]["reference_varies"] is True
    copied = {"config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json"}
    assert copied <= set(report["files"])
    for name in copied:
        assert (out / name).read_bytes() == (bert_dir / name).read_bytes()
    # the tokenizer next to the model drives it: dynamic batch and sequence, logits as transformers gives them
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    enc = tok(["hello world", "abc"], padding=True, return_tensors="np")
    (logits,) = run_onnx(out / "model.onnx", {k: v.astype(np.int64) for k, v in enc.items()})
    import torch

    model = transformers.BertForSequenceClassification.from_pretrained(bert_dir, local_files_only=True).eval()
    with torch.no_grad():
        expected = model(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in enc.items()}).logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    assert not (bert_dir / "report.json").exists() and sorted(p.name for p in bert_dir.iterdir()) == sorted(
        ["config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json"])


def test_bert_feature_extraction_task_given_inputs_overridden(cli, bert_dir, tmp_path):
    fixed = [f"--input={name}:1,sequence:int64" for name in ("input_ids", "attention_mask", "token_type_ids")]
    report = converted(cli, bert_dir, tmp_path / "out", "--task", "feature-extraction", "--dim", "sequence=5", *fixed)
    assert [o["name"] for o in report["contract"]["outputs"]] == ["last_hidden_state"]
    assert report["contract"]["sample_dims"]["sequence"] == 5
    inputs = {i["name"]: i for i in report["contract"]["inputs"]}
    assert inputs["input_ids"]["shape"] == [1, "sequence"] and inputs["input_ids"]["value_range"] == [0, 100]


def test_unknown_value_name_is_exit_2(cli, bert_dir, tmp_path):
    r = cli("convert", bert_dir, "-o", tmp_path / "out", "--value", "pixel_values=1")
    assert r.exit_code == 2 and "pixel_values" in r.stderr and "input_ids" in r.stderr


@pytest.mark.parametrize(("cls", "outputs"), [
    ("BertForTokenClassification", ["logits"]),
    ("BertForQuestionAnswering", ["start_logits", "end_logits"]),
    ("BertForMaskedLM", ["logits"]),
])
def test_bert_heads_inferred(cli, tmp_path, cls, outputs):
    folder = save(getattr(transformers, cls)(transformers.BertConfig(**BERT)), tmp_path / "model")
    report = converted(cli, folder, tmp_path / "out")
    assert [o["name"] for o in report["contract"]["outputs"]] == outputs


# --- tasks that do not fit -------------------------------------------------------------------------------


def test_task_of_another_modality_is_exit_2(cli, bert_dir, tmp_path):
    r = cli("convert", bert_dir, "-o", tmp_path / "out", "--task", "image-classification")
    assert r.exit_code == 2
    assert f"{bert_dir}: task image-classification does not fit this bert model" in r.stderr
    assert not (tmp_path / "out").exists()


def test_task_whose_head_the_checkpoint_lacks_is_exit_2(cli, bert_dir, tmp_path):
    r = cli("convert", bert_dir, "-o", tmp_path / "out", "--task", "fill-mask")
    assert r.exit_code == 2
    assert f"{bert_dir}: task fill-mask needs weights the checkpoint lacks: no cls.predictions." in r.stderr
    assert ("(the checkpoint is a BertForSequenceClassification: the weights of BertForMaskedLM's fill-mask head are absent; "
            "convert it as text-classification, or use a checkpoint trained for fill-mask)") in r.stderr


# --- weights that do not cover the model ------------------------------------------------------------------


def reworked(folder: Path, dest: Path, *, drop: tuple[str, ...] = (), **config) -> Path:
    """A copy of `folder` whose safetensors lack the tensors `drop` and whose config.json has `config` set."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, dest)
    if drop:
        weights = load_file(dest / "model.safetensors")
        for key in drop:
            del weights[key]
        save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    if config:
        (dest / "config.json").write_text(json.dumps({**json.loads((dest / "config.json").read_text()), **config}))
    return dest


def tree_digest(folder: Path) -> dict:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("case", "reason"), [
    ("missing", "the weights do not fit config.json: no classifier.weight in the weights (transformers would initialise it at "
                "random)"),
    ("resized", "the weights do not fit config.json: classifier.bias is [3] in the weights but [5] by the config "
                "(2 tensors differ)"),
])
def test_weights_that_do_not_cover_the_model_are_one_line_exit_2(cli_proc, bert_dir, tmp_path, case, reason):
    """transformers fills a tensor the safetensors lack, or hold at another size than config.json
    makes, with random values: the convert would pass parity against an equally random reference.
    Through the real CLI process: one stderr line naming the folder and the tensor, no output, the
    folder untouched."""
    labels = {"id2label": {str(i): f"L{i}" for i in range(5)}, "label2id": {f"L{i}": i for i in range(5)}}
    src = (reworked(bert_dir, tmp_path / "src", drop=("classifier.weight",)) if case == "missing"
           else reworked(bert_dir, tmp_path / "src", **labels))
    before = tree_digest(src)
    r = cli_proc("convert", src, "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == [f"error: {src}: {reason}"], r.stderr
    assert r.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert tree_digest(src) == before


def test_t5_without_a_decoder_weight_is_exit_2(cli, tmp_path):
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=37, num_layers=1, num_decoder_layers=1, num_heads=2,
                                   decoder_start_token_id=0)
    full = save(transformers.T5ForConditionalGeneration(config), tmp_path / "t5")
    src = reworked(full, tmp_path / "src", drop=("decoder.block.0.layer.0.SelfAttention.q.weight",))
    r = cli("convert", src, "-o", tmp_path / "out")
    assert r.exit_code == 2
    assert (f"{src}: the weights do not fit config.json: no decoder.block.0.layer.0.SelfAttention.q.weight in the weights "
            "(transformers would initialise it at random)") in r.stderr
    assert not (tmp_path / "out").exists()


def test_task_head_a_base_checkpoint_never_had_is_exit_2(cli, tmp_path):
    folder = save(transformers.BertModel(transformers.BertConfig(**BERT)), tmp_path / "base")
    r = cli("convert", folder, "-o", tmp_path / "out", "--task", "text-classification")
    assert r.exit_code == 2
    assert (f"{folder}: task text-classification needs weights the checkpoint lacks: no classifier.bias and 1 more in the weights "
            "(transformers would initialise them at random) (the checkpoint is a BertModel: the weights of "
            "BertForSequenceClassification's text-classification head are absent; convert it as feature-extraction, or use a "
            "checkpoint trained for text-classification)") in r.stderr
    assert not (tmp_path / "out").exists()


def test_feature_extraction_of_a_masked_lm_checkpoint_needs_no_pooler(cli, tmp_path):
    """A masked-LM checkpoint (roberta-base's kind) has no pooler; last_hidden_state never reads it."""
    import onnx

    folder = save(transformers.BertForMaskedLM(transformers.BertConfig(**BERT)), tmp_path / "mlm")
    report = converted(cli, folder, tmp_path / "out", "--task", "feature-extraction")
    assert [o["name"] for o in report["contract"]["outputs"]] == ["last_hidden_state"]
    assert not [i.name for i in onnx.load(tmp_path / "out" / "model.onnx").graph.initializer if "pooler" in i.name]


def test_weights_transformers_fills_itself_are_not_refused(tmp_path):
    """What transformers declares it fills on its own is no gap: BART's `final_logits_bias` (zeros,
    `_keys_to_ignore_on_load_missing`) and the output embedding tied to the input one; a tensor
    the model needs is one."""
    config = transformers.BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32)
    from safetensors.torch import load_file

    full = save(transformers.BartForConditionalGeneration(config), tmp_path / "bart")
    stored = set(load_file(full / "model.safetensors"))
    assert "lm_head.weight" not in stored  # tied to the shared embedding, not saved
    task = hf_tasks.TASKS["text2text-generation"]

    def load(folder):
        with hf_loading.offline() as tf:
            return hf_loading.load_model(task, folder, hf_folder.read_config(folder), trust=False, safetensors=True,
                                         inferred=True, transformers=tf)

    model = load(reworked(full, tmp_path / "no-bias", drop=("final_logits_bias",)))
    assert not model.final_logits_bias.any() and model.lm_head.weight is model.model.shared.weight
    with pytest.raises(BadInputError, match=r"no model\.decoder\.layernorm_embedding\.weight in the weights"):
        load(reworked(full, tmp_path / "no-norm", drop=("model.decoder.layernorm_embedding.weight",)))


def test_text_generation_of_an_encoder_folder_is_exit_2(cli, bert_dir, tmp_path):
    r = cli("convert", bert_dir, "-o", tmp_path / "out", "--task", "text-generation")
    assert r.exit_code == 2 and "is not a supported text-generation family" in r.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_task_fails_before_any_work(cli, bert_dir, tmp_path):
    r = cli("convert", bert_dir, "-o", tmp_path / "out", "--task", "poetry")
    assert r.exit_code == 2 and "unknown task 'poetry'" in r.stderr


def test_task_on_another_source_is_exit_2(cli, tiny_onnx, tmp_path):
    r = cli("convert", tiny_onnx, "-o", tmp_path / "out", "--task", "text-classification")
    assert r.exit_code == 2 and "--task applies to Hugging Face model folders" in r.stderr


def test_output_inside_the_folder_is_refused(cli, bert_dir):
    r = cli("convert", bert_dir, "-o", bert_dir / "onnx")
    assert r.exit_code == 2 and not (bert_dir / "onnx").exists()


# --- vision and audio ---------------------------------------------------------------------------------------


def test_vit_image_classification(cli, tmp_path):
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=37, num_labels=4)
    folder = save(transformers.ViTForImageClassification(config), tmp_path / "vit")
    report = converted(cli, folder, tmp_path / "out")
    (spec,) = report["contract"]["inputs"]
    assert (spec["name"], spec["shape"], spec["layout"]) == ("pixel_values", ["batch", 3, 32, 32], "NCHW")
    (logits,) = run_onnx(tmp_path / "out" / "model.onnx", {"pixel_values": np.zeros((3, 3, 32, 32), np.float32)})
    assert logits.shape == (3, 4)


def test_segformer_semantic_segmentation(cli, tmp_path):
    config = transformers.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                          num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
                                          decoder_hidden_size=32, num_labels=3, image_size=64)
    folder = save(transformers.SegformerForSemanticSegmentation(config), tmp_path / "segformer")
    report = converted(cli, folder, tmp_path / "out")
    assert report["contract"]["inputs"][0]["shape"] == ["batch", 3, 64, 64]
    assert report["contract"]["outputs"][0]["name"] == "logits"


def test_wav2vec2_audio_classification(cli, tmp_path):
    config = transformers.Wav2Vec2Config(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=37, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
                                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, num_labels=3,
                                         do_stable_layer_norm=True, feat_extract_norm="layer")
    folder = save(transformers.Wav2Vec2ForSequenceClassification(config), tmp_path / "w2v")
    report = converted(cli, folder, tmp_path / "out", "--dim", "samples=4000")
    (spec,) = report["contract"]["inputs"]
    assert (spec["name"], spec["shape"]) == ("input_values", ["batch", "samples"])
    assert report["contract"]["sample_dims"]["samples"] == 4000
    assert [o["name"] for o in report["contract"]["outputs"]] == ["logits"]


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory) -> Path:
    config = transformers.WhisperConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                                        decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, num_mel_bins=16,
                                        max_source_positions=32, max_target_positions=32, decoder_start_token_id=1, pad_token_id=0)
    return save(transformers.WhisperForConditionalGeneration(config), tmp_path_factory.mktemp("whisper") / "model")


def test_whisper_speech_encoder(cli, whisper_dir, tmp_path):
    report = converted(cli, whisper_dir, tmp_path / "out", "--task", "speech-encoder")
    (spec,) = report["contract"]["inputs"]
    assert (spec["name"], spec["shape"]) == ("input_features", ["batch", 16, 64])  # num_mel_bins x 2*max_source_positions
    assert [o["name"] for o in report["contract"]["outputs"]] == ["last_hidden_state"]


def test_whisper_speech_recognition_inferred(cli, whisper_dir, tmp_path):
    report = converted(cli, whisper_dir, tmp_path / "out")
    parts = {p["name"]: p["contract"] for p in report["parts"]}
    assert [i["name"] for i in parts["encoder"]["inputs"]] == ["input_features"]
    assert {i["name"]: i["shape"] for i in parts["decoder"]["inputs"]} == {
        "decoder_input_ids": ["batch", "decoder_sequence"], "encoder_hidden_states": ["batch", 32, 32]}
    assert (tmp_path / "out" / "encoder" / "model.onnx").is_file() and (tmp_path / "out" / "decoder" / "model.onnx").is_file()


# --- text2text: two validated models -------------------------------------------------------------------------------


def test_t5_text2text_encoder_and_decoder(cli, tmp_path):
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=2, num_heads=2,
                                   decoder_start_token_id=0)
    folder = save(transformers.T5ForConditionalGeneration(config), tmp_path / "t5")
    out = tmp_path / "out"
    report = converted(cli, folder, out)
    assert report["contract"] is None
    parts = {p["name"]: p for p in report["parts"]}
    assert list(parts) == ["encoder", "decoder"] and parts["decoder"]["path"] == "decoder"
    assert [i["name"] for i in parts["encoder"]["contract"]["inputs"]] == ["input_ids", "attention_mask"]
    dec_inputs = {i["name"]: i["shape"] for i in parts["decoder"]["contract"]["inputs"]}
    assert dec_inputs == {"decoder_input_ids": ["batch", "decoder_sequence"], "encoder_hidden_states": ["batch", "sequence", 32],
                          "encoder_attention_mask": ["batch", "sequence"]}
    assert sorted((a["part"], a["path"]) for a in report["artifacts"]) == [("decoder", "decoder/model.onnx"),
                                                                            ("encoder", "encoder/model.onnx")]
    assert sorted(h["hop"] for h in report["parity"]) == sorted(
        f"{p}: huggingface→onnx ({k})" for p in ("encoder", "decoder") for k in ("IR", "end to end"))
    assert {"config.json", "generation_config.json"} <= set(report["files"]) and (out / "generation_config.json").is_file()
    # the two ONNX models chained give the logits of the whole transformers model
    import torch

    ids = np.array([[5, 17, 42, 9, 1]], np.int64)
    mask = np.ones_like(ids)
    dec = np.array([[0, 7, 3]], np.int64)
    (hidden,) = run_onnx(out / "encoder" / "model.onnx", {"input_ids": ids, "attention_mask": mask})
    (logits,) = run_onnx(out / "decoder" / "model.onnx",
                         {"decoder_input_ids": dec, "encoder_hidden_states": hidden, "encoder_attention_mask": mask})
    model = transformers.T5ForConditionalGeneration.from_pretrained(folder, local_files_only=True).eval()
    with torch.no_grad():
        expected = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         decoder_input_ids=torch.from_numpy(dec)).logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    from jsonschema import Draft202012Validator

    from modelport.validation.report import SCHEMA_FILE

    Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(report)


# --- safety -------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pickled_dir(tmp_path_factory) -> Path:
    """A folder with config.json and only a pickled pytorch_model.bin."""
    import torch

    folder = tmp_path_factory.mktemp("pickled") / "model"
    model = transformers.BertModel(transformers.BertConfig(**BERT))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


def test_pickled_weights_only_are_refused(cli, pickled_dir, tmp_path):
    r = cli("convert", pickled_dir, "-o", tmp_path / "out")
    assert r.exit_code == 3
    assert f"{pickled_dir}: only pickled weights (pytorch_model.bin)" in r.stderr and "--trust" in r.stderr
    assert not (tmp_path / "out").exists()


def test_pickled_weights_with_trust(cli, pickled_dir, tmp_path):
    report = converted(cli, pickled_dir, tmp_path / "out", "--trust", "--task", "feature-extraction")
    assert "pickle" in report["source"]["format"]


def test_auto_map_is_refused_without_trust(cli, bert_dir, tmp_path):
    folder = tmp_path / "remote"
    shutil.copytree(bert_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_evil.py").write_text(f"open({str(tmp_path / 'marker')!r}, 'w').write('ran')\n")
    r = cli("convert", folder, "-o", tmp_path / "out")
    assert r.exit_code == 3 and "auto_map" in r.stderr and "trust_remote_code" in r.stderr
    assert not (tmp_path / "marker").exists()


def test_folder_without_weights_is_exit_2(cli, bert_dir, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    shutil.copy(bert_dir / "config.json", folder)
    r = cli("convert", folder, "-o", tmp_path / "out")
    assert r.exit_code == 2 and "no weights" in r.stderr


def test_bad_safetensors_header_is_exit_2(cli, bert_dir, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    shutil.copy(bert_dir / "config.json", folder)
    (folder / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")
    r = cli("convert", folder, "-o", tmp_path / "out")
    assert r.exit_code == 2 and "safetensors header" in r.stderr


def cache_layout(bert_dir: Path, root: Path) -> Path:
    """The folder as the Hugging Face cache holds it: snapshots/REV/* are links into blobs/."""
    blobs, snapshot = root / "models--org--bert" / "blobs", root / "models--org--bert" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in bert_dir.iterdir():
        shutil.copy(f, blobs / f"blob-{f.name}")
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", f"blob-{f.name}"))
    return snapshot


def test_cache_snapshot_links_are_followed(cli, bert_dir, tmp_path):
    info = cli("inspect", cache_layout(bert_dir, tmp_path), "--json").json()
    assert info["weights"] == ["model.safetensors"] and "tokenizer.json" in info["files"]


def test_link_leading_outside_the_folder_is_refused(cli, bert_dir, tmp_path):
    snapshot = cache_layout(bert_dir, tmp_path / "cache")
    (tmp_path / "secret").write_text("not yours")
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to(tmp_path / "secret")
    r = cli("convert", snapshot, "-o", tmp_path / "out")
    assert r.exit_code == 3 and "tokenizer.json links outside the model folder" in r.stderr


# --- inspect ----------------------------------------------------------------------------------------------------------


def test_inspect_folder(cli, bert_dir):
    r = cli("inspect", bert_dir, "--json")
    assert r.exit_code == 0, r
    info = r.json()
    assert (info["format"], info["model_type"], info["task"]) == ("huggingface", "bert", "text-classification")
    assert [i["name"] for i in info["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert info["weights"] == ["model.safetensors"] and "tokenizer.json" in info["files"]
    assert info["parameters"] > 0

