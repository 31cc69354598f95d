"""GroupQueryAttention with rotary embedding for our KV-cache decoder exports (parsers/hf_decoder.py).

Runs after onnxscript's `optimize_for_ort`, which leaves each layer's attention as
`com.microsoft.MultiHeadAttention` over keys and values that repeat_kv has expanded from
`kv_heads` to `num_heads` (Unsqueeze → Expand → Reshape of the whole cache at every step), and the
rotary embedding as `q·cos + rotate_half(q)·sin` (Slice, Neg, Concat, Mul, Add), or, where onnxscript's
own rotary rules fire (transformers 5.17 exports), as `com.microsoft.RotaryEmbedding(x, position_ids, cos, sin)`
with cos/sin of head_dim/2 per position computed at run time (the query's then reads the [B, S, H·D]
projection directly and feeds the attention unmerged). Per layer this rewrite matches, anchored on the graph's own structure rather than on node names:

    present.{i}.key   = Concat(past_key_values.{i}.key,   rope(heads(k_proj)))
    present.{i}.value = Concat(past_key_values.{i}.value, heads(v_proj))
    attention         = MultiHeadAttention(merge(rope(heads(q_proj))), repeat_kv(present.{i}.key), …, mask)
    o_proj            = MatMul(Reshape*(attention), W_o)

and replaces it with

    qkv = MatMul(x, [W_q | W_k | W_v]) [+ [b_q | b_k | b_v]]      (Phi-3's fused qkv_proj is used as it is)
    attention, present.{i}.key, present.{i}.value = com.microsoft.GroupQueryAttention(qkv, '', '', past…,
        seqlens_k, total_sequence_length, cos_cache, sin_cache, position_ids, attention_bias, query_seqlens;
        do_rotary=1)

Exactness with left padding (Hugging Face positions of a left-padded row start at 0 at its first real
token, not at its first slot): the op sees every row as full length (`seqlens_k = total_sequence - 1`,
`total_sequence_length = attention_mask.shape[1]`), so the cache grows exactly like the Concat it
replaces; the padded slots are masked by an additive `attention_bias` built once from
`attention_mask` (transformers' own finite minimum, so fully padded query rows stay NaN-free); the
rotation reads the model's `position_ids` input; and `query_seqlens` (= sequence for every row) lets a
batch > 1 extend a cache by more than one token, which onnxruntime refuses otherwise, and makes the
op rotate a first prompt by each row's own position ids. Measured on onnxruntime 1.32: with these
inputs the fused model equals the unfused export (max difference about 2e-7) at prefill and decode
with a left-padded batch; without `query_seqlens` a first prompt is rotated from its first position
id onwards, so a left-padded row's cache differs by up to 0.5 (its logits still agree: rotary
attention scores depend only on relative positions, but the next decode step would not).
cos/sin caches are the export's own rotary subgraph evaluated at positions 0..context_length-1, so
they hold exactly what the export computes (rope scaling included).

A layer that does not match (a different rotary form, a partial rotary, an attention node with
other inputs) is left as it was and named in the result.
"""

from __future__ import annotations

import numpy as np

from modelport.optimize.gqa_matching import MS, Graph, NoMatch, ancestors, attr, match_layer, packed_slices, projection
from modelport.optimize.weight_store import drop_unused_initializers

BIAS_MIN = float(np.finfo(np.float32).min)  # transformers' own masked-out value: finite, so padded rows stay NaN-free


def rotary_caches(model, g: Graph, cos: str, sin: str, positions: int, head_dim: int):
    """(cos_cache, sin_cache) [positions, head_dim/2]: the export's own cos/sin subgraph evaluated at
    positions 0..positions-1 (it must read `position_ids` only). Each position's row is either head_dim wide
    with each angle twice (rotate_half form) or head_dim/2 wide (RotaryEmbedding form, one angle per pair)."""
    import onnx
    import onnxruntime as ort

    nodes, reads = ancestors(g, [cos, sin])
    if reads != {"position_ids"}:
        raise NoMatch(f"rotary cos/sin read {sorted(reads)}, not position_ids alone")
    used = {i for n in nodes for i in n.input}
    pos_in = next(i for i in g.graph.input if i.name == "position_ids")
    outs = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in (cos, sin)]
    inits = [t for t in g.graph.initializer if t.name in used]
    if g.store is not None:  # weights held outside the proto (optimize/weight_store.py)
        inits = [g.store.materialize(t) for t in inits]
    sub = onnx.helper.make_graph(list(nodes), "rotary", [pos_in], outs, initializer=inits)
    sub_model = onnx.helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    session = ort.InferenceSession(sub_model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"position_ids": np.arange(positions, dtype=np.int64)[None, :]})
    caches = []
    half = head_dim // 2
    for v in got:
        if v.size == positions * half:
            caches.append(np.ascontiguousarray(v.reshape(positions, half).astype(np.float32)))
            continue
        if v.size != positions * head_dim:
            raise NoMatch(f"rotary cos/sin of shape {v.shape} is not one row of head_dim or head_dim/2 per position")
        v = v.reshape(positions, head_dim).astype(np.float32)
        if not np.array_equal(v[:, :half], v[:, half:]):
            raise NoMatch("rotary cos/sin do not repeat each angle over the two halves")
        caches.append(np.ascontiguousarray(v[:, :half]))
    return caches[0], caches[1]


def _toposort(graph) -> None:
    produced = {}
    for idx, n in enumerate(graph.node):
        for o in n.output:
            if o:
                produced[o] = idx
    deps = [{produced[i] for i in n.input if i in produced} for n in graph.node]
    order, done, state = [], set(), {}
    for start in range(len(graph.node)):
        stack = [(start, False)]
        while stack:
            idx, expanded = stack.pop()
            if idx in done:
                continue
            if expanded:
                done.add(idx)
                order.append(idx)
                continue
            if state.get(idx):
                continue
            state[idx] = True
            stack.append((idx, True))
            stack.extend((d, False) for d in sorted(deps[idx], reverse=True) if d not in done)
    nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)


def _dce(graph) -> None:
    """Drop nodes nothing reads (graph outputs are read) and initializers no node reads."""
    live = {o.name for o in graph.output}
    keep = []
    for n in reversed(list(graph.node)):
        if any(o in live for o in n.output if o):
            keep.append(n)
            live.update(i for i in n.input if i)
            for a in n.attribute:  # subgraph reads of outer names
                for sg in ([a.g] if a.g.node else []) + list(a.graphs):
                    live.update(i for sn in sg.node for i in sn.input if i)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)

    drop_unused_initializers(graph, live)


def fuse_group_query_attention(model, *, context_length: int, pack_qkv: bool = True, store=None):
    """(model with GroupQueryAttention layers, details): `model` is changed in place (the caller passes a copy).
    details: layers (how many), fused (which), unfused ({layer: reason}), packed_qkv (layers packed).
    `store` (optimize/weight_store.py) reads the weights `model` holds as references."""
    import onnx
    import onnx.numpy_helper as nh

    graph = model.graph
    names = {i.name for i in graph.input}
    n_layers = 0
    while f"past_key_values.{n_layers}.key" in names:
        n_layers += 1
    details = {"layers": n_layers, "fused": [], "unfused": {}, "packed_qkv": 0}
    if not n_layers or not {"attention_mask", "position_ids"} <= names:
        details["unfused"]["model"] = "not a KV-cache decoder export (no past_key_values / attention_mask / position_ids)"
        return model, details
    past = next(i for i in graph.input if i.name == "past_key_values.0.key").type.tensor_type.shape.dim
    kv_heads, head_dim = past[1].dim_value, past[3].dim_value
    if not kv_heads or not head_dim or head_dim % 2:
        details["unfused"]["model"] = "the cache's kv_heads/head_dim are not static"
        return model, details

    g = Graph(graph, store)
    layers, caches = [], {}
    for i in range(n_layers):
        try:
            layer = match_layer(g, i, head_dim)
            if (layer.cos, layer.sin) not in caches:
                caches[(layer.cos, layer.sin)] = rotary_caches(model, g, layer.cos, layer.sin, context_length, head_dim)
            layers.append(layer)
        except NoMatch as e:
            details["unfused"][str(i)] = str(e)
    if not layers:
        return model, details

    new_nodes, new_inits = [], []
    make = onnx.helper.make_node

    def const(name, value):
        new_inits.append(nh.from_array(np.asarray(value), name))
        return name

    # once per model: seqlens_k, total_sequence_length, attention_bias (padding only; GQA adds the causal part)
    p = "gqa_"
    new_nodes += [
        make("Shape", ["attention_mask"], [p + "mask_shape"]),
        make("Gather", [p + "mask_shape", const(p + "one", np.int64(1))], [p + "total64"], axis=0),
        make("Cast", [p + "total64"], [p + "total_sequence_length"], to=onnx.TensorProto.INT32),
        make("Sub", [p + "total_sequence_length", const(p + "one32", np.int32(1))], [p + "total_minus_1"]),
        make("Shape", ["attention_mask"], [p + "batch"], start=0, end=1),
        make("Expand", [p + "total_minus_1", p + "batch"], [p + "seqlens_k"]),
        make("Equal", ["attention_mask", const(p + "zero64", np.int64(0))], [p + "padded"]),
        make("Where", [p + "padded", const(p + "min", np.float32(BIAS_MIN)), const(p + "zero", np.float32(0))],
             [p + "pad_bias"]),
        make("Unsqueeze", [p + "pad_bias", const(p + "axes12", np.array([1, 2], np.int64))], [p + "pad_bias4"]),
        make("Shape", ["input_ids"], [p + "sequence"], start=1, end=2),
        make("Concat", [const(p + "ones2", np.array([1, 1], np.int64)), p + "sequence",
                        const(p + "ones1", np.array([1], np.int64))], [p + "bias_shape"], axis=0),
        make("Expand", [p + "pad_bias4", p + "bias_shape"], [p + "attention_bias"]),
        # every query row is valid (padding is in the bias): this lets a batch > 1 extend a cache by several tokens
        make("Cast", [p + "sequence"], [p + "sequence32"], to=onnx.TensorProto.INT32),
        make("Expand", [p + "sequence32", p + "batch"], [p + "query_seqlens"]),
    ]
    cache_names = {}
    for j, (key, (cos_c, sin_c)) in enumerate(caches.items()):
        cache_names[key] = (const(f"{p}cos_cache_{j}", cos_c), const(f"{p}sin_cache_{j}", sin_c))

    drop = set()
    for layer in layers:
        i = layer.index
        lp = f"{p}{i}_"
        q, k, v = layer.q, layer.k, layer.v
        num_heads = int(attr(layer.mha, "num_heads"))
        packed = packed_slices(g, q, k, v, num_heads, kv_heads, head_dim)
        projs = [projection(g, t) for t in (q, k, v)] if pack_qkv and packed is None else [None]
        if all(projs) and len({x for x, _, _ in projs}) == 1:
            x = projs[0][0]
            w = np.concatenate([w for _, w, _ in projs], axis=1)
            packed = lp + "qkv"
            new_nodes.append(make("MatMul", [x, const(lp + "qkv_weight", w)], [packed]))
            if any(b is not None for _, _, b in projs):
                bias = np.concatenate([b if b is not None else np.zeros(w_.shape[1], w_.dtype) for _, w_, b in projs])
                new_nodes.append(make("Add", [packed, const(lp + "qkv_bias", bias)], [lp + "qkv_biased"]))
                packed = lp + "qkv_biased"
        if packed is not None:
            details["packed_qkv"] += 1
        cos_n, sin_n = cache_names[(layer.cos, layer.sin)]
        scale = attr(layer.mha, "scale", None)
        scale = float(scale) if scale is not None else float(1.0 / np.sqrt(head_dim))
        qkv = [packed, "", ""] if packed is not None else [q, k, v]
        new_nodes.append(make(
            "GroupQueryAttention",
            [*qkv, f"past_key_values.{i}.key", f"past_key_values.{i}.value", p + "seqlens_k", p + "total_sequence_length",
             cos_n, sin_n, "position_ids", p + "attention_bias", "", "", "", "", "", p + "query_seqlens"],
            [lp + "attention", f"present.{i}.key", f"present.{i}.value"], domain=MS,
            num_heads=num_heads, kv_num_heads=kv_heads, scale=scale, do_rotary=1, rotary_interleaved=0))
        for idx, name in enumerate(layer.o_node.input):
            if name == layer.o_input:
                layer.o_node.input[idx] = lp + "attention"
        drop.update((id(layer.ck), id(layer.cv), id(layer.mha)))
        details["fused"].append(i)

    kept = [n for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(new_nodes + kept)
    graph.initializer.extend(new_inits)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS, 1))
    _toposort(graph)
    _dce(graph)
    # value_info of removed tensors would only confuse later shape inference
    live = {o for n in graph.node for o in n.output}
    vi = [v for v in graph.value_info if v.name in live]
    del graph.value_info[:]
    graph.value_info.extend(vi)
    return model, details
