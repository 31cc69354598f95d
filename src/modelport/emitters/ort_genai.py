"""The ort-genai target: a folder onnxruntime-genai loads (`og.Model(folder)`), for decoder LMs.

It holds the KV-cache model (`model.onnx`, + `model.onnx.data` when large), `genai_config.json`
describing it (input/output names, heads, layers, special tokens, greedy search defaults) and the
source folder's tokenizer files, copied as they are. The model's names are the ones ort-genai's
decoder expects (`past_key_values.%d.key`, `present.%d.key`). In the unfused export `present` is a
Concat that grows by the new tokens, so `past_present_share_buffer` is false; a model whose attention
is `com.microsoft.GroupQueryAttention` (optimize/gqa_fusion.py) writes the new tokens into the cache
buffer it is given, so there past and present share one max-length buffer (no copy of the whole cache
per step) and the flag is true.

Only an IR from a text-generation source (`parsers/hf_decoder.py`) can be written: other models
are refused by the preflight. Validation is by generation (`validation/generation.py`), not by
the IR's single-step references.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.onnx import write_model
from modelport.emitters.preflight import Preflight, opset_of
from modelport.ir import IRModel
from modelport.onnxfile.onnx_io import save_onnx

NAME = "ort-genai"
RUNTIME = "onnxruntime-genai"
DESCRIPTION = "onnxruntime-genai folder (genai_config.json, model, tokenizer) for decoder LMs (--task text-generation)"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json", "chat_template.jinja")


def genai_config(decoder: dict, *, filename: str = "model.onnx", share_buffer: bool = False) -> dict:
    """genai_config.json for a KV-cache decoder with our input/output names (`share_buffer`: past and
    present share one buffer, for a model with GroupQueryAttention)."""
    eos = decoder.get("eos_token_id")
    pad = decoder.get("pad_token_id")
    if pad is None:
        pad = eos[0] if isinstance(eos, list) and eos else eos
    if pad is None:
        pad = 0
    ctx = int(decoder["context_length"])
    return {
        "model": {
            "bos_token_id": decoder.get("bos_token_id"),
            "context_length": ctx,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": decoder["head_dim"],
                "hidden_size": decoder["hidden_size"],
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": decoder["num_heads"],
                "num_hidden_layers": decoder["num_layers"],
                "num_key_value_heads": decoder["kv_heads"],
            },
            "eos_token_id": eos if eos is not None else pad,
            "pad_token_id": pad,
            "type": decoder["family"],
            "vocab_size": decoder["vocab_size"],
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
            "max_length": ctx, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
            "num_return_sequences": 1, "past_present_share_buffer": share_buffer, "repetition_penalty": 1.0,
            "temperature": 1.0, "top_k": 1, "top_p": 1.0,
        },
    }


def write_folder(model, decoder: dict, source_folder: str | Path | None, out_dir: Path, *,
                 external: bool | None = None, base_dir: Path | None = None) -> list[Path]:
    """The ort-genai folder for an ONNX decoder model (a ModelProto); returns the files written.
    `external`: the weights in model.onnx.data (None: only past onnx_io's size threshold).
    `base_dir`: the folder of `model`'s own data file, when it refers to one (onnx_io.save_onnx)."""

    out_dir.mkdir(parents=True, exist_ok=True)
    files = save_onnx(model, out_dir / "model.onnx", external=external, base_dir=base_dir)
    return files + write_config(model, decoder, source_folder, out_dir)


def write_config(model, decoder: dict, source_folder: str | Path | None, out_dir: Path) -> list[Path]:
    """genai_config.json for the decoder model (a ModelProto) written in `out_dir`, and the source
    folder's tokenizer files beside it; returns the files written."""
    cfg = out_dir / "genai_config.json"
    share = any(n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft" for n in model.graph.node)
    cfg.write_text(json.dumps(genai_config(decoder, share_buffer=share), indent=2) + "\n")
    files = [cfg]
    if source_folder is not None:
        src = Path(source_folder)
        for name in TOKENIZER_FILES:
            f = src / name
            if f.is_file() and not f.is_symlink():
                shutil.copyfile(f, out_dir / name)
                files.append(out_dir / name)
    return files


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    """The folder, its model written as the ONNX target writes a decoder's (emitters/onnx.py)."""

    folder = out_dir / "ort-genai"
    folder.mkdir(parents=True, exist_ok=True)
    files = write_model(model, folder / "model.onnx")
    files += write_config(model.model, model.provenance.get("decoder"), model.provenance.get("path"), folder)
    return Artifact(target=NAME, runtime=RUNTIME, path=folder, files=files, precision=options.precision,
                    details={"nodes": len(model.model.graph.node), "opset": model.provenance.get("opset"),
                             "tokenizer": (folder / "tokenizer.json").is_file()})


def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    """Refuses a model that is not a KV-cache decoder from a text-generation source."""
    p = Preflight(NAME, RUNTIME, None, opset_of(ir.model), None, nodes=len(ir.model.graph.node))
    if not isinstance(ir.provenance.get("decoder"), dict):
        p.unsupported.append({"node": "(model)", "op": "-", "reason": "--to ort-genai needs a decoder LM exported with "
                              "--task text-generation from a Hugging Face folder"})
    return p
