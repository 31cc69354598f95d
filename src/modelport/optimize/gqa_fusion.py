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

from collections import defaultdict

import numpy as np

MS = "com.microsoft"
BIAS_MIN = float(np.finfo(np.float32).min)  # transformers' own masked-out value: finite, so padded rows stay NaN-free


class NoMatch(Exception):
    """A layer's attention is not in the form this rewrite replaces (the message says where)."""


class _Graph:
    """Producer/consumer maps and constant lookup over a GraphProto (rebuilt after each change)."""

    def __init__(self, graph, store=None):
        import onnx.numpy_helper as nh

        self.graph, self.store = graph, store
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.consumers = defaultdict(list)
        for n in graph.node:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.inits = {t.name: t for t in graph.initializer}
        self.consts = {}
        for n in graph.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
                for a in n.attribute:
                    if a.name == "value":
                        self.consts[n.output[0]] = nh.to_array(a.t)
        self._nh = nh

    def const(self, name):
        """The value of an initializer or Constant output, else None."""
        if name in self.consts:
            return self.consts[name]
        if name in self.inits:
            tensor = self.inits[name]
            return self.store.array(tensor) if self.store is not None else self._nh.to_array(tensor)
        return None

    def node(self, name, op, domain=("", "ai.onnx")):
        n = self.producer.get(name)
        if n is None or n.op_type != op or n.domain not in domain:
            raise NoMatch(f"{name!r} is not produced by {op}")
        return n


def _attr(node, name, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _heads(g: _Graph, name: str) -> str:
    """`Transpose(Reshape(x, [B, S, heads, D]), perm 0,2,1,3)` → x ([batch, sequence, heads·D])."""
    t = g.node(name, "Transpose")
    if list(_attr(t, "perm", [])) != [0, 2, 1, 3]:
        raise NoMatch(f"{name!r}: transpose is not BSNH→BNSH")
    r = g.node(t.input[0], "Reshape")
    return r.input[0]


def _int_const(g: _Graph, name: str, what: str) -> int:
    v = g.const(name) if name else None
    if v is None or v.size != 1:
        raise NoMatch(f"{what} is not a constant")
    return int(v.reshape(-1)[0])


def _rotary_node(g: _Graph, name: str, head_dim: int):
    """`com.microsoft.RotaryEmbedding(t, position_ids, cos, sin)` (onnxscript's rotary rule, e.g. on transformers
    5.17 exports) → (t, cos, sin, node), or None when `name` is not produced by one; full rotary, halves not interleaved,
    positions from the model's position_ids (the same ones GroupQueryAttention then reads)."""
    n = g.producer.get(name)
    if n is None or n.op_type != "RotaryEmbedding" or n.domain != MS:
        return None
    if len(n.input) != 4 or n.input[1] != "position_ids":
        raise NoMatch(f"{name!r}: RotaryEmbedding does not read position_ids")
    if _attr(n, "interleaved", 0) or _attr(n, "is_packed_batching", 0):
        raise NoMatch(f"{name!r}: interleaved or packed-batch RotaryEmbedding")
    if _attr(n, "rotary_embedding_dim", 0) not in (0, head_dim):
        raise NoMatch(f"{name!r}: partial rotary")
    if float(_attr(n, "scale", 1.0)) != 1.0:
        raise NoMatch(f"{name!r}: RotaryEmbedding with a scale")
    return n.input[0], n.input[2], n.input[3], n


def _rope(g: _Graph, name: str, head_dim: int):
    """`t·cos + Concat(-t[..., D/2:], t[..., :D/2])·sin` → (t, cos, sin); full rotary, rotate_half form,
    or the same rotation as one RotaryEmbedding node (_rotary_node)."""
    rotary = _rotary_node(g, name, head_dim)
    if rotary is not None:
        return rotary[:3]
    add = g.node(name, "Add")
    muls = [g.node(i, "Mul") for i in add.input]
    for rot, plain in (muls, muls[::-1]):
        cat = next((g.producer.get(i) for i in rot.input if getattr(g.producer.get(i), "op_type", "") == "Concat"), None)
        if cat is None or len(cat.input) != 2 or _attr(cat, "axis") not in (-1, 3):
            continue
        sin = next(i for i in rot.input if i != cat.output[0])
        neg = g.node(cat.input[0], "Neg")
        hi, lo = g.node(neg.input[0], "Slice"), g.node(cat.input[1], "Slice")
        t = lo.input[0]
        if hi.input[0] != t or t not in plain.input:
            raise NoMatch(f"{name!r}: rotate_half reads another tensor than the rotation")
        cos = plain.input[1] if plain.input[0] == t else plain.input[0]
        half = head_dim // 2
        for s, (start, end) in ((lo, (0, half)), (hi, (half, None))):
            axis = _int_const(g, s.input[3], "slice axis") if len(s.input) > 3 and s.input[3] else 0
            if axis not in (-1, 3) or (len(s.input) > 4 and s.input[4] and _int_const(g, s.input[4], "slice step") != 1):
                raise NoMatch(f"{name!r}: rotate_half slices another axis")
            b, e = _int_const(g, s.input[1], "slice start"), _int_const(g, s.input[2], "slice end")
            if b != start or (e != end if end is not None else e < head_dim):
                raise NoMatch(f"{name!r}: partial rotary or interleaved halves")
        return t, cos, sin
    raise NoMatch(f"{name!r} is not a rotate_half rotary embedding")


def _forward_to(g: _Graph, name: str, op: str, limit: int = 12):
    """The first `op` node reached from `name` through at most `limit` nodes (breadth first)."""
    frontier, seen = [name], set()
    for _ in range(limit):
        nxt = []
        for t in frontier:
            for c in g.consumers.get(t, []):
                if c.op_type == op:
                    return c
                if id(c) not in seen:
                    seen.add(id(c))
                    nxt.extend(o for o in c.output if o)
        frontier = nxt
    raise NoMatch(f"no {op} after {name!r}")


def _ancestors(g: _Graph, names) -> tuple[list, set]:
    """(nodes in graph order that `names` depend on, graph inputs they read)."""
    graph_inputs = {i.name for i in g.graph.input}
    need, stack, reads = set(), list(names), set()
    while stack:
        t = stack.pop()
        if t in graph_inputs:
            reads.add(t)
        n = g.producer.get(t)
        if n is None or id(n) in need:
            continue
        need.add(id(n))
        stack.extend(i for i in n.input if i)
        for a in n.attribute:
            if a.g.node or a.graphs:
                raise NoMatch("rotary subgraph holds a control-flow node")
    return [n for n in g.graph.node if id(n) in need], reads


def rotary_caches(model, g: _Graph, cos: str, sin: str, positions: int, head_dim: int):
    """(cos_cache, sin_cache) [positions, head_dim/2]: the export's own cos/sin subgraph evaluated at
    positions 0..positions-1 (it must read `position_ids` only). Each position's row is either head_dim wide
    with each angle twice (rotate_half form) or head_dim/2 wide (RotaryEmbedding form, one angle per pair)."""
    import onnx
    import onnxruntime as ort

    nodes, reads = _ancestors(g, [cos, sin])
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


def _projection(g: _Graph, name: str):
    """`MatMul(x, W)` or `Add(MatMul(x, W), b)` (either Add order) with constant W, b → (x, W, b or None)."""
    n = g.producer.get(name)
    bias = None
    if n is not None and n.op_type == "Add":
        for a, b in (n.input, n.input[::-1]):
            mm = g.producer.get(a)
            if mm is not None and mm.op_type == "MatMul" and g.const(b) is not None:
                n, bias = mm, g.const(b)
                break
        else:
            return None
    if n is None or n.op_type != "MatMul":
        return None
    w = g.const(n.input[1])
    if w is None or w.ndim != 2 or (bias is not None and bias.shape != (w.shape[1],)):
        return None
    return n.input[0], w, bias


def _packed_slices(g: _Graph, q: str, k: str, v: str, heads: int, kv_heads: int, head_dim: int) -> str | None:
    """The tensor q, k and v are consecutive last-axis Slices of, covering all of it in that order
    (an export of a fused qkv_proj, e.g. Phi-3), else None."""
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    src, offset = None, 0
    for name, size in zip((q, k, v), sizes, strict=True):
        n = g.producer.get(name)
        if n is None or n.op_type != "Slice" or len(n.input) < 4 or (src is not None and n.input[0] != src):
            return None
        src = n.input[0]
        try:
            axis = _int_const(g, n.input[3], "slice axis")
            step = _int_const(g, n.input[4], "slice step") if len(n.input) > 4 and n.input[4] else 1
            b, e = _int_const(g, n.input[1], "slice start"), _int_const(g, n.input[2], "slice end")
        except NoMatch:
            return None
        if axis not in (-1, 2) or step != 1 or b != offset or (e != offset + size and not (name == v and e >= 2**31 - 1)):
            return None
        offset += size
    proj = _projection(g, src)
    if proj is None or proj[1].shape[1] != offset:
        return None
    return src


class _Layer:
    def __init__(self, index, q, k, v, cos, sin, mha, o_input, o_node, ck, cv):
        self.index, self.q, self.k, self.v, self.cos, self.sin = index, q, k, v, cos, sin
        self.mha, self.o_input, self.o_node, self.ck, self.cv = mha, o_input, o_node, ck, cv


def _match_layer(g: _Graph, i: int, head_dim: int) -> _Layer:
    past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
    ck, cv = g.node(f"present.{i}.key", "Concat"), g.node(f"present.{i}.value", "Concat")
    for c, past in ((ck, past_k), (cv, past_v)):
        if list(c.input)[:1] != [past] or len(c.input) != 2 or _attr(c, "axis") not in (2, -2):
            raise NoMatch(f"{c.output[0]!r} is not Concat(past, new) on the sequence axis")
    k_pre, cos, sin = _rope(g, ck.input[1], head_dim)
    k = _heads(g, k_pre)
    v = _heads(g, cv.input[1])
    mha = _forward_to(g, ck.output[0], "MultiHeadAttention")
    if mha.domain != MS or _forward_to(g, cv.output[0], "MultiHeadAttention") is not mha:
        raise NoMatch(f"layer {i}: keys and values do not meet in one MultiHeadAttention")
    ins = list(mha.input) + [""] * (8 - len(mha.input))
    if ins[3] or ins[4] or ins[6] or ins[7] or not ins[5]:
        raise NoMatch(f"layer {i}: MultiHeadAttention with a bias, a past of its own or no mask")
    if _attr(mha, "unidirectional", 0):
        raise NoMatch(f"layer {i}: unidirectional MultiHeadAttention")
    # query: Reshape(Transpose(rope(heads(q)), 0,2,1,3), [B, S, H·D]), or RotaryEmbedding(q) on [B, S, H·D] itself
    rotary = _rotary_node(g, mha.input[0], head_dim)
    if rotary is not None:
        q, q_cos, q_sin, node = rotary
        if _attr(node, "num_heads", 0) not in (0, _attr(mha, "num_heads")):
            raise NoMatch(f"layer {i}: query RotaryEmbedding splits another number of heads")
        if getattr(g.producer.get(q), "op_type", "") == "Transpose":
            raise NoMatch(f"layer {i}: query RotaryEmbedding on BNSH heads fed to attention unmerged")
    else:
        r = g.node(mha.input[0], "Reshape")
        t = g.node(r.input[0], "Transpose")
        if list(_attr(t, "perm", [])) != [0, 2, 1, 3]:
            raise NoMatch(f"layer {i}: query is not merged from BNSH")
        q_pre, q_cos, q_sin = _rope(g, t.input[0], head_dim)
        q = _heads(g, q_pre)
    if (q_cos, q_sin) != (cos, sin):
        raise NoMatch(f"layer {i}: query and key rotate with different cos/sin")
    _, reads = _ancestors(g, [ins[5]])
    if "attention_mask" not in reads:
        raise NoMatch(f"layer {i}: the attention mask does not come from attention_mask")
    out, node, swapped = mha.output[0], None, False
    while True:  # Reshapes, and BSNH↔BNSH transposes that cancel, up to the o_proj MatMul
        users = g.consumers.get(out, [])
        if len(users) != 1:
            raise NoMatch(f"layer {i}: the attention output has {len(users)} users")
        node = users[0]
        if node.op_type == "MatMul" and node.input[0] == out and not swapped:
            break
        if node.op_type == "Transpose" and list(_attr(node, "perm", [])) == [0, 2, 1, 3]:
            swapped = not swapped
        elif node.op_type != "Reshape":
            raise NoMatch(f"layer {i}: {node.op_type} between attention and o_proj")
        out = node.output[0]
    return _Layer(i, q, k, v, cos, sin, mha, out, node, ck, cv)


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
    from modelport.optimize.weight_store import drop_unused_initializers

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

    g = _Graph(graph, store)
    layers, caches = [], {}
    for i in range(n_layers):
        try:
            layer = _match_layer(g, i, head_dim)
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
        num_heads = int(_attr(layer.mha, "num_heads"))
        packed = _packed_slices(g, q, k, v, num_heads, kv_heads, head_dim)
        projs = [_projection(g, t) for t in (q, k, v)] if pack_qkv and packed is None else [None]
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
        scale = _attr(layer.mha, "scale", None)
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
