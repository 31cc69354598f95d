"""Decoder-only language models from a Hugging Face folder, exported with a KV cache.

A `save_pretrained` folder (config.json + safetensors) of a family with rotary embeddings,
grouped-query attention, RMSNorm and a gated MLP (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma2) becomes
one ONNX model that serves both prefill (an empty past) and decode (one new token):

    inputs   input_ids [batch, sequence] int64, attention_mask [batch, total_sequence] int64,
             position_ids [batch, sequence] int64,
             past_key_values.{i}.key / .value [batch, kv_heads, past_sequence, head_dim]
    outputs  logits [batch, sequence, vocab],
             present.{i}.key / .value [batch, kv_heads, total_sequence, head_dim]

These are the names onnxruntime-genai's decoder expects (`past_key_values.%d.key`,
`present.%d.key`), so the same file serves our own generation loop and an ort-genai folder.

How: `torch.onnx.export(dynamo=True)` of a wrapper module that takes the cache as flat tensors,
builds a `transformers` DynamicCache from them, runs the model and returns the grown cache flat.
The folder is loaded with `local_files_only=True` and `use_safetensors=True` under
`HF_HUB_OFFLINE=1`: nothing is fetched and no pickle is read. A family outside the table is
refused (exit 2) before anything is loaded.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from pathlib import Path

from modelport.deps import require
from modelport.errors import UnsupportedError, one_line
from modelport.ir import IRModel, specs_from_onnx
from modelport.optimize.weight_store import forget_onnxscript_matches
from modelport.parsers.hf_decoder_config import DecoderConfig, read_decoder_config, sniff
from modelport.parsers.hf_decoder_loading import load_model
from modelport.parsers.hf_decoder_step import (
    SAMPLE_PAST,
    SAMPLE_SEQUENCE,
    flat_cache_module,
    reference_step,
    sample_step,
    transformers_reference,
)
from modelport.run.progress import doing

# what other packages call this module for; read_decoder_config and sniff live in
# hf_decoder_config.py, load_model in hf_decoder_loading.py, transformers_reference in hf_decoder_step.py
__all__ = ["export_decoder", "export_failure", "export_task", "ir_of", "load_model", "name_dims", "parse", "parse_loaded",
           "read_decoder_config", "sniff", "transformers_reference"]

NAME = "hf-decoder"
DESCRIPTION = "Hugging Face decoder-only LM folder (config.json + safetensors), exported with a KV cache"
TASK = "text-generation"

log = logging.getLogger(__name__)


def export_decoder(folder: str | Path, *, opset: int | None = None, model=None, cfg: DecoderConfig | None = None,
                   save_to: Path | None = None):
    """(onnx.ModelProto, DecoderConfig): the folder's decoder with a KV cache, dims named batch,
    sequence, past_sequence and total_sequence.

    `save_to` (a path `.../model.onnx`): the exporter writes the model there, its weights tensor by
    tensor into `model.onnx.data` beside it, straight from the torch tensors, and the ModelProto
    returned holds the graph only (its initializers refer to that file). The weights are then never
    held twice in memory (as torch tensors and as protobuf bytes)."""
    folder = Path(folder)
    cfg = cfg or read_decoder_config(folder)
    model = model if model is not None else load_model(folder)
    torch = require("torch")
    module = flat_cache_module(model, cfg)
    feeds = sample_step(cfg)
    args = [torch.from_numpy(feeds[n]) for n in cfg.input_names]
    dim = torch.export.Dim
    batch, seq, past, total = dim("batch"), dim("sequence"), dim("past_sequence"), dim("total_sequence")
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, tuple({0: batch, 2: past} for _ in cfg.past_names))
    for name in ("torch.onnx", "torch.export", "torch._dynamo", "torch.fx"):
        logging.getLogger(name).setLevel(logging.ERROR)

    captured = io.StringIO()
    import warnings

    with doing("torch.onnx.export, dynamo"), contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prog = torch.onnx.export(module, tuple(args), dynamo=True, input_names=cfg.input_names,
                                     output_names=cfg.output_names, dynamic_shapes=shapes, opset_version=opset,
                                     external_data=False, optimize=True)
        except Exception as e:
            raise UnsupportedError(f"{cfg.architecture} cannot be exported with a KV cache: {export_failure(e)}",
                                   path=folder) from None

    forget_onnxscript_matches()  # else a rewrite rule keeps the export's graph, and the torch parameters in it
    if save_to is None:
        onnx_model = prog.model_proto
        name_dims(onnx_model, cfg)
        return onnx_model, cfg
    import onnx

    with doing(f"writing the export's weights to {save_to.name}.data"):
        prog.save(str(save_to), external_data=True)
    del prog
    onnx_model = onnx.load(str(save_to), load_external_data=False)
    name_dims(onnx_model, cfg)
    onnx.save_model(onnx_model, str(save_to))  # the graph with its dims named; the data file stays as written
    return onnx_model, cfg


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def export_failure(error: BaseException) -> str:
    """One line for a failed torch.onnx.export: the first line of the error that started it (the
    exporter's own first line only says which of its steps failed), and the source line that
    raised it when the exporter names one."""
    root = error
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    text = one_line(ANSI.sub("", str(root))) or type(root).__name__
    where = re.search(r'File "([^"]+)", line (\d+), in (\w+)', ANSI.sub("", f"{error}\n{root}"))
    if where:
        text += f" (at {'/'.join(Path(where[1]).parts[-2:])}:{where[2]}, in {where[3]})"
    return text


def name_dims(model, cfg: DecoderConfig) -> None:
    """The exporter names derived dims by their formula ('past_sequence + sequence'): call them
    total_sequence on the graph's outputs, as the attention mask does."""
    present = set(cfg.present_names)
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        if out.name in present and len(dims) == 4:
            dims[2].dim_param = "total_sequence"
        elif out.name == "logits" and len(dims) == 3:
            dims[0].dim_param, dims[1].dim_param = "batch", "sequence"


def parse(source, spec) -> IRModel:
    """The IR of a decoder folder, with the reference outputs of one left-padded decode step."""
    folder = Path(source)
    cfg = read_decoder_config(folder)
    return parse_loaded(folder, spec, load_model(folder), cfg)


def export_task(task, ctx) -> IRModel:
    """The `text-generation` entry of the Hugging Face parser's task table (parsers/huggingface.py)."""
    return parse(ctx.folder, ctx.spec)


def parse_loaded(folder: Path, spec, model, cfg: DecoderConfig, *, save_to: Path | None = None) -> IRModel:
    """`parse` for a model already loaded (the caller keeps it, e.g. to generate references).
    `save_to`: see `export_decoder` (the IR's model is then the graph, its weights in that file)."""
    onnx_model, cfg = export_decoder(folder, opset=spec.opset, model=model, cfg=cfg, save_to=save_to)
    return ir_of(folder, spec, onnx_model, cfg, model, exporter="torch.onnx dynamo (flat KV cache)")


def ir_of(folder: Path, spec, onnx_model, cfg: DecoderConfig, model, *, exporter: str) -> IRModel:
    """The IR of a decoder graph (exported or written); its reference is the transformers `model`'s
    outputs on one left-padded decode step (none when `model` is None: see `reference_step`)."""
    inputs = specs_from_onnx(onnx_model.graph.input)
    for s in inputs:
        if s.name == "input_ids":
            s.value_range = [0, cfg.vocab_size]
    return IRModel(
        model=onnx_model,
        inputs=inputs,
        outputs=specs_from_onnx(onnx_model.graph.output),
        provenance={
            "framework": "transformers", "format": f"Hugging Face folder ({cfg.architecture})", "path": str(folder),
            "exporter": exporter, "task": TASK, "decoder": cfg.to_dict(),
            "opset": next((o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx")), None),
        },
        reference=reference_step(model, cfg, spec.seed) if model is not None else None,
        sample_dims={"batch": 2, "sequence": SAMPLE_SEQUENCE, "past_sequence": SAMPLE_PAST,
                     "total_sequence": SAMPLE_PAST + SAMPLE_SEQUENCE},
    )
