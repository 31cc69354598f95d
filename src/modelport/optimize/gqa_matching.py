"""The pattern the GroupQueryAttention fusion (optimize/gqa_fusion.py) replaces: one layer's
attention in our KV-cache decoder exports, matched on the graph's own structure (producers and
consumers, constant inputs) rather than on node names. A layer in any other form raises NoMatch,
whose message says where the match failed.
"""

from __future__ import annotations

from collections import defaultdict

MS = "com.microsoft"


class NoMatch(Exception):
    """A layer's attention is not in the form this rewrite replaces (the message says where)."""


class Graph:
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


def attr(node, name, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _heads(g: Graph, name: str) -> str:
    """`Transpose(Reshape(x, [B, S, heads, D]), perm 0,2,1,3)` → x ([batch, sequence, heads·D])."""
    t = g.node(name, "Transpose")
    if list(attr(t, "perm", [])) != [0, 2, 1, 3]:
        raise NoMatch(f"{name!r}: transpose is not BSNH→BNSH")
    r = g.node(t.input[0], "Reshape")
    return r.input[0]


def _int_const(g: Graph, name: str, what: str) -> int:
    v = g.const(name) if name else None
    if v is None or v.size != 1:
        raise NoMatch(f"{what} is not a constant")
    return int(v.reshape(-1)[0])


def _rotary_node(g: Graph, name: str, head_dim: int):
    """`com.microsoft.RotaryEmbedding(t, position_ids, cos, sin)` (onnxscript's rotary rule, e.g. on transformers
    5.17 exports) → (t, cos, sin, node), or None when `name` is not produced by one; full rotary, halves not interleaved,
    positions from the model's position_ids (the same ones GroupQueryAttention then reads)."""
    n = g.producer.get(name)
    if n is None or n.op_type != "RotaryEmbedding" or n.domain != MS:
        return None
    if len(n.input) != 4 or n.input[1] != "position_ids":
        raise NoMatch(f"{name!r}: RotaryEmbedding does not read position_ids")
    if attr(n, "interleaved", 0) or attr(n, "is_packed_batching", 0):
        raise NoMatch(f"{name!r}: interleaved or packed-batch RotaryEmbedding")
    if attr(n, "rotary_embedding_dim", 0) not in (0, head_dim):
        raise NoMatch(f"{name!r}: partial rotary")
    if float(attr(n, "scale", 1.0)) != 1.0:
        raise NoMatch(f"{name!r}: RotaryEmbedding with a scale")
    return n.input[0], n.input[2], n.input[3], n


def _rope(g: Graph, name: str, head_dim: int):
    """`t·cos + Concat(-t[..., D/2:], t[..., :D/2])·sin` → (t, cos, sin); full rotary, rotate_half form,
    or the same rotation as one RotaryEmbedding node (_rotary_node)."""
    rotary = _rotary_node(g, name, head_dim)
    if rotary is not None:
        return rotary[:3]
    add = g.node(name, "Add")
    muls = [g.node(i, "Mul") for i in add.input]
    for rot, plain in (muls, muls[::-1]):
        cat = next((g.producer.get(i) for i in rot.input if getattr(g.producer.get(i), "op_type", "") == "Concat"), None)
        if cat is None or len(cat.input) != 2 or attr(cat, "axis") not in (-1, 3):
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


def _forward_to(g: Graph, name: str, op: str, limit: int = 12):
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


def ancestors(g: Graph, names) -> tuple[list, set]:
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


def projection(g: Graph, name: str):
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


def packed_slices(g: Graph, q: str, k: str, v: str, heads: int, kv_heads: int, head_dim: int) -> str | None:
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
    proj = projection(g, src)
    if proj is None or proj[1].shape[1] != offset:
        return None
    return src


class _Layer:
    def __init__(self, index, q, k, v, cos, sin, mha, o_input, o_node, ck, cv):
        self.index, self.q, self.k, self.v, self.cos, self.sin = index, q, k, v, cos, sin
        self.mha, self.o_input, self.o_node, self.ck, self.cv = mha, o_input, o_node, ck, cv


def match_layer(g: Graph, i: int, head_dim: int) -> _Layer:
    past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
    ck, cv = g.node(f"present.{i}.key", "Concat"), g.node(f"present.{i}.value", "Concat")
    for c, past in ((ck, past_k), (cv, past_v)):
        if list(c.input)[:1] != [past] or len(c.input) != 2 or attr(c, "axis") not in (2, -2):
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
    if attr(mha, "unidirectional", 0):
        raise NoMatch(f"layer {i}: unidirectional MultiHeadAttention")
    # query: Reshape(Transpose(rope(heads(q)), 0,2,1,3), [B, S, H·D]), or RotaryEmbedding(q) on [B, S, H·D] itself
    rotary = _rotary_node(g, mha.input[0], head_dim)
    if rotary is not None:
        q, q_cos, q_sin, node = rotary
        if attr(node, "num_heads", 0) not in (0, attr(mha, "num_heads")):
            raise NoMatch(f"layer {i}: query RotaryEmbedding splits another number of heads")
        if getattr(g.producer.get(q), "op_type", "") == "Transpose":
            raise NoMatch(f"layer {i}: query RotaryEmbedding on BNSH heads fed to attention unmerged")
    else:
        r = g.node(mha.input[0], "Reshape")
        t = g.node(r.input[0], "Transpose")
        if list(attr(t, "perm", [])) != [0, 2, 1, 3]:
            raise NoMatch(f"layer {i}: query is not merged from BNSH")
        q_pre, q_cos, q_sin = _rope(g, t.input[0], head_dim)
        q = _heads(g, q_pre)
    if (q_cos, q_sin) != (cos, sin):
        raise NoMatch(f"layer {i}: query and key rotate with different cos/sin")
    _, reads = ancestors(g, [ins[5]])
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
        if node.op_type == "Transpose" and list(attr(node, "perm", [])) == [0, 2, 1, 3]:
            swapped = not swapped
        elif node.op_type != "Reshape":
            raise NoMatch(f"layer {i}: {node.op_type} between attention and o_proj")
        out = node.output[0]
    return _Layer(i, q, k, v, cos, sin, mha, out, node, ck, cv)
