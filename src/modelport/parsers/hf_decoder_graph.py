"""Decoder LMs written as ONNX straight from the folder's config and safetensors, without tracing.

For the families whose layer is the plain Llama block (Llama, Mistral, Qwen2, Qwen3: RMSNorm,
rotary attention with grouped key/value heads, a SiLU-gated MLP), the graph follows from
config.json alone, so it is written node by node here and each weight is read from the safetensors,
converted to fp32 and appended to the data file one tensor at a time. Nothing is traced, and neither the
transformers model nor the graph's weights are ever held whole: peak memory is one tensor (the
largest, the embedding, and its transpose for the output projection), and a 0.5 B-parameter folder
is written in seconds where the dynamo export takes minutes (bench/llm_scale.py). The inputs, outputs
and dims are those of the export (parsers/hf_decoder.py), so everything after it is unchanged, and
the result is checked against transformers like the export is (the IR's decode step, then generation).

Two forms, from one description of the layer:

    plain  standard ONNX ops only (opset 18): the IR of `convert --task text-generation`
           RMSNorm          x · 1/sqrt(mean(x²) + eps) · w
           rotary           x·cos + rotate_half(x)·sin, cos/sin gathered at position_ids from a table
           attention        softmax(q·kᵀ·scale + bias)·v over the grown cache, the query heads of one
                            key/value head stacked (no copy of the cache per query head), bias = 0
                            where the key is real and not in the future, else float32's minimum
    fused  onnxruntime's ops, what `--optimize all` asks for: SimplifiedLayerNormalization and
           SkipSimplifiedLayerNormalization, q/k/v in one MatMul, com.microsoft.GroupQueryAttention with
           the rotary inside (cos/sin caches, the model's position_ids, a padding bias, every query row
           valid: optimize/gqa_fusion.py says why each input is needed for left-padded batches), gate and
           up in one MatMul

The rotary tables are computed as transformers computes them, in float32 (rope types default,
linear and llama3).

`dtype="float16"` writes either form in half precision, as a float16 transformers model computes:
weights, activations, the key/value cache and the logits in float16; the RMSNorm statistics and the
attention softmax in float32 (cast there and back, as transformers upcasts them), the rotary tables
computed in float32 and stored in float16. A weight beyond float16's range is clamped to ±65504 and
counted in the details (`clamped`).

A folder outside this description
(another family, a sliding window shorter than the context, an activation other than SiLU, an
unexpected tensor) is named by `unsupported` and goes to the dynamo export instead.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.optimize.decoder_fusion import FUSED_OPS
from modelport.parsers.graph_writer import GraphWriter
from modelport.parsers.hf_decoder_builder import MS, Builder
from modelport.parsers.hf_decoder_config import DecoderConfig, text_config
from modelport.parsers.hf_decoder_rotary import rotary_tables
from modelport.parsers.hf_decoder_weights import Weights, expected_shapes
from modelport.run.progress import doing

# what other packages read here; MS is hf_decoder_builder.py's
__all__ = ["EXPORTER", "FAMILIES", "MS", "unsupported", "write_decoder"]

EXPORTER = "modelport decoder writer (config + safetensors)"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
OPSET = 18
DTYPES_WRITTEN = {"float32": np.float32, "float16": np.float16}
ROPE_TYPES = ("default", "linear", "llama3")


def unsupported(folder: Path, cfg: DecoderConfig, opset: int | None = None) -> str | None:
    """Why this folder cannot be written directly (it is then exported with dynamo), or None."""
    if cfg.family not in FAMILIES:
        return f"family {cfg.family} (the writer covers {', '.join(FAMILIES)})"
    if opset is not None and opset < OPSET:
        return f"opset {opset} (the writer writes opset {OPSET})"
    text = text_config(folder)
    act = text.get("hidden_act") or text.get("hidden_activation") or "silu"
    if act != "silu":
        return f"activation {act}"
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ROPE_TYPES:
        return f"rope type {kind}"
    if text.get("partial_rotary_factor") not in (None, 1, 1.0):
        return "partial rotary"
    if any(t != "full_attention" for t in text.get("layer_types") or []):
        return "sliding-window layers"
    window = text.get("sliding_window")
    uses_window = text.get("use_sliding_window", cfg.family == "mistral")
    if uses_window and window is not None and int(window) < cfg.context_length:
        return f"a sliding window of {window}"
    if cfg.head_dim % 2:
        return "an odd head_dim"
    return None


def write_decoder(folder: str | Path, cfg: DecoderConfig, path: Path, *, fused: bool = False, reuse=None,
                  opset: int | None = None, dtype: str = "float32"):
    """Write the folder's decoder to `path` (model.onnx, its weights in model.onnx.data beside it);
    returns (the ModelProto, graph only: its initializers refer to the data file, details).
    `reuse`: a model written here before into the same folder as `path` (the other form): the
    tensors it holds in its data file are referred to there, not read or written again (the two
    forms share every weight, so the second form is a graph alone). `opset`: the default opset's
    version (OPSET when None; the ops written are the same from OPSET on). `dtype`: float32 or float16
    (see the module docstring)."""
    import functools

    import onnx


    folder = Path(folder)
    text = text_config(folder)
    eps = float(text.get("rms_norm_eps", 1e-6))
    weights = Weights(folder, expected_shapes(folder, cfg))
    shared = {t.name: t for t in reuse.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL} if reuse else {}
    w = GraphWriter(path.parent / (path.name + ".data"), shared)
    try:
        b = Builder(w, weights, cfg, eps, fused, DTYPES_WRITTEN[dtype])
        b.inputs_and_masks(functools.cache(lambda: rotary_tables(folder, cfg)))
        hidden = w.node("Gather", [b.weight("model.embed_tokens.weight", lambda: weights.get("model.embed_tokens.weight")),
                                   "input_ids"], name="embed_tokens")
        residual, normed = hidden, None
        for i in range(cfg.num_layers):
            with doing(f"writing layer {i + 1} of {cfg.num_layers}"):
                residual, normed = b.layer(i, residual, normed)
        with doing("writing the output projection"):
            b.head(residual, normed)
    finally:
        w.close()
    graph = onnx.helper.make_graph(w.nodes, "decoder", b.graph_inputs(), b.graph_outputs(), initializer=w.initializers)
    opsets = [onnx.helper.make_opsetid("", opset or OPSET)] + ([onnx.helper.make_opsetid(MS, 1)] if fused else [])
    model = onnx.helper.make_model(graph, opset_imports=opsets, producer_name="modelport")
    model.ir_version = min(model.ir_version, 10)
    onnx.save_model(model, str(path))
    from collections import Counter


    ops = Counter(n.op_type for n in model.graph.node)
    details = {"writer": EXPORTER, "nodes": len(model.graph.node), "fused": {op: ops[op] for op in FUSED_OPS if ops[op]},
               "dtype": dtype, **({"clamped": b.clamped} if b.clamped else {})}
    if fused:
        details["group_query_attention"] = {"fused": list(range(cfg.num_layers)), "unfused": {},
                                            "packed_qkv": b.packed_qkv}
    return model, details
