"""Fusions for KV-cache decoder exports (`parsers/hf_decoder.py`) into onnxruntime's ops.

onnxscript's `ort_fusions.optimize_for_ort` is written against `torch.onnx` dynamo exports of
Llama-like decoders. On ours it turns RMSNorm (Pow → ReduceMean → Add → Sqrt → Reciprocal → Mul)
into `SimplifiedLayerNormalization`, a residual Add followed by RMSNorm into
`SkipSimplifiedLayerNormalization`, and scaled-dot-product attention with the cache concat into
`com.microsoft.MultiHeadAttention` over keys and values expanded by repeat_kv. Our own rewrite
(optimize/gqa_fusion.py) then turns each layer's attention into `com.microsoft.GroupQueryAttention`
on the un-expanded cache, with the rotary embedding inside it (from the model's position_ids) and the
q/k/v projections packed into one MatMul; the MLP's gate and up projections are packed the same way
(`pack_sibling_matmuls`). The result runs in onnxruntime only (contrib ops); the
caller keeps it only when generation still matches the source (see orchestration/text_generation.py).

onnxscript's own GroupQueryAttention rules are not run. They take the attention mask for purely
causal: on the export transformers 5.17 writes (5.23's mask takes another form, which they do not
match) they fuse every layer, and the model then generates differently from transformers on a
left-padded batch (token agreement 0.375, worst logit error 0.87), so the whole fusion was rolled
back. Without them the layers become MultiHeadAttention (exact), which our rewrite turns into
GroupQueryAttention where it recognises the layer.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

from modelport.deps import require
from modelport.optimize.exact_rules import exact_default_rules
from modelport.optimize.gqa_fusion import fuse_group_query_attention
from modelport.optimize.weight_store import WeightStore, drop_unused_initializers, forget_onnxscript_matches

FUSED_OPS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "MultiHeadAttention",
             "GroupQueryAttention", "RotaryEmbedding")


DEFAULT_CONTEXT = 4096  # rotary cache rows when the caller does not know the model's context length


def fuse_decoder(model, *, context_length: int | None = None, group_query_attention: bool = True,
                 base_dir: str | Path | None = None):
    """(fused ModelProto, details with node counts before/after and fused ops); the input is not modified.
    `context_length` bounds the positions the rotary caches hold (the config's max_position_embeddings).
    `base_dir`: the folder of `model`'s external data, when its initializers refer to a file (an
    export written with external data): weights are then read from there as needed.
    details["group_query_attention"] says which layers were fused and why any other was not.

    The fused model holds each weight it uses once, in memory: while the passes run its large
    weights stay where they are (in `model` or its data file) and are copied in at the end
    (optimize/weight_store.py), so the run holds `model` and one fused copy, no more."""
    import logging

    require("onnxscript", purpose="decoder fusions")
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort


    logging.getLogger("onnxscript").setLevel(logging.ERROR)

    store = WeightStore(base_dir)
    names = [t.name for t in model.graph.initializer]  # onnx-ir renames through the wrapped protos: put back below
    graph = onnx_ir.from_proto(model)  # wraps `model`'s tensors, never changes them
    if base_dir is not None:
        onnx_ir.external_data.set_base_dir(graph.graph, str(base_dir))
    # exact no-op rules: onnxscript's own would drop an epsilon smaller than 1e-8 (optimize/exact_rules.py)
    with _without_onnxscript_gqa(), exact_default_rules():
        fused, stats = optimize_for_ort(graph)
    store.detach(fused)
    out = onnx_ir.to_proto(fused)
    del fused, graph

    forget_onnxscript_matches()  # the rules' matchers hold the graph just rewritten, and `model`'s weights with it
    for tensor, name in zip(model.graph.initializer, names, strict=True):
        tensor.name = name
    rules = {k: v for k, v in stats.items() if v}
    gqa = None
    if group_query_attention:

        out, gqa = fuse_group_query_attention(out, context_length=context_length or DEFAULT_CONTEXT, store=store)
        if gqa["fused"]:
            rules["group_query_attention"] = len(gqa["fused"])
        packed = pack_sibling_matmuls(out, store=store)
        if packed:
            rules["packed_matmuls"] = packed
    store.attach(out)
    ops = Counter(n.op_type for n in out.graph.node)
    details = {"nodes_before": len(model.graph.node), "nodes": len(out.graph.node),
               "fused": {op: ops[op] for op in FUSED_OPS if ops[op]}, "rules": rules}
    if gqa is not None:
        details["group_query_attention"] = gqa
    return out, details


ONNXSCRIPT_GQA_RULES = ("fuse_gqa", "fuse_qkv_gqa")


@contextlib.contextmanager
def _without_onnxscript_gqa():
    """onnxscript's GroupQueryAttention rules switched off while its fusions run (module docstring)."""
    from onnxscript.rewriter.ort_fusions import _core

    saved = {name: getattr(_core, name) for name in ONNXSCRIPT_GQA_RULES if hasattr(_core, name)}
    try:
        for name in saved:
            setattr(_core, name, lambda model, debug=False, **kw: 0)
        yield
    finally:
        for name, rule in saved.items():
            setattr(_core, name, rule)


def pack_sibling_matmuls(model, *, store=None) -> int:
    """MatMul(x, A) and MatMul(x, B) with constant 2-D A, B of one dtype and depth → Split(MatMul(x, [A | B]))
    (e.g. an MLP's gate and up projections): one GEMV per decode step instead of two, and one MatMulNBits
    after weight-only quantisation. The columns of x·[A | B] are x·A and x·B, so the result is the same.
    Changes `model` in place; returns how many pairs it packed. `store` (optimize/weight_store.py)
    reads weights held outside the proto; without it, external ones are left alone."""
    import numpy as np
    import onnx
    import onnx.numpy_helper as nh

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    users: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    replace, drop, packed = {}, set(), 0
    for x, nodes in users.items():
        mms = [n for n in nodes if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and n.input[0] == x
               and n.input[1] in inits and len(inits[n.input[1]].dims) == 2]
        if len(mms) != 2 or mms[0].input[1] == mms[1].input[1]:
            continue
        a, b = (inits[n.input[1]] for n in mms)
        if a.data_type != b.data_type or a.dims[0] != b.dims[0] or (store is None and (a.data_location or b.data_location)):
            continue
        name = f"packed_{packed}_{mms[0].output[0]}"
        read = store.array if store is not None else nh.to_array
        wa, wb = read(a), read(b)
        graph.initializer.append(nh.from_array(np.concatenate([wa, wb], axis=1), name + "_weight"))
        del wa, wb
        graph.initializer.append(nh.from_array(np.array([a.dims[1], b.dims[1]], np.int64), name + "_sizes"))
        replace[id(mms[0])] = [onnx.helper.make_node("MatMul", [x, name + "_weight"], [name]),
                               onnx.helper.make_node("Split", [name, name + "_sizes"], [mms[0].output[0], mms[1].output[0]],
                                                     axis=-1)]
        drop.add(id(mms[1]))
        packed += 1
    if not packed:
        return 0
    nodes = []
    for n in graph.node:
        nodes.extend(replace.get(id(n), [] if id(n) in drop else [n]))
    del graph.node[:]
    graph.node.extend(nodes)

    drop_unused_initializers(graph, {i for n in graph.node for i in n.input})
    return packed

