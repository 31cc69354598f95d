"""Shifted normalisation: every LayerNorm, GroupNorm and InstanceNorm of the ONNX IR fed its input
less the first element of each group it normalises (x - x₀), so that a constant frame reaches the
runtime's kernel as exact zeros.

The maths: each of these computes (x - mean(x)) / sqrt(var(x) + eps) · γ + β over a group (the
last axes, a channel group, a channel's spatial axes), and that is unchanged when a value constant
over the group is subtracted from x first: mean(x - s) = mean(x) - s and var(x - s) = var(x). With
s = the group's first element, a constant group becomes exact zeros (x - x is exact), so its mean,
its variance and its normalised values are exact zeros in any kernel (one pass or two, fused or
not) and the output is β, as the source computes it. Elsewhere the shift is one subtraction per
element, whose rounding (|x - s| ≤ 2·max|x|) is of the order of the centring's own, and it makes
a one-pass variance better conditioned, not worse.

Why (measured here on LayerNorm(384) → Linear and GroupNorm(2, 8) → Conv fed a constant frame of
float32(20·log10(eps)) = -138.4738, 20·log10 of float32's eps, what audio front ends give on
digital silence): a kernel whose mean of a constant frame is off by one ulp (1.5e-5 at 138) turns
that ulp into ulp/sqrt(eps) ≈ 5e-3 of normalised output, and a one-pass variance E[x²]-E[x]²
cancels to a negative value and gives NaN. LiteRT's MEAN (onnx2tf and litert-torch both write
MEAN, SQUARED_DIFFERENCE, MEAN: already two passes) missed by 6e-3 to 0.6, with XNNPACK's
delegate and with the builtin kernels alike; OpenVINO's CPU plugin at f32 by 7e-3 to 5e-2;
ExecuTorch's portable `native_layer_norm` (E[x²]-E[x]²) gave NaN at some widths (80 at -15.94,
192 at -138.47) and its `native_group_norm` NaN too. A centred two-pass rewrite (y = x - mean(x),
var = mean(y²)) does not help: its mean is the inexact one, 0.13 off in LiteRT and ExecuTorch. The
shifted form gives 2e-7 in all of them, for every full-mantissa constant in [-200, -15].

What is rewritten (top-level graph; a node the rewrite cannot prove exact is left as it is, with
the reason in `Shifted.skipped`):

- LayerNormalization over axes [axis, rank): x - x[..., :1, ..., :1]; its Mean output (when used)
  gets s added back, so it stays the mean of x;
- GroupNormalization: x reshaped to (N, groups, -1), less its first element per group, reshaped
  back;
- InstanceNormalization: x - x[:, :, :1, ..., :1];
- the decomposed form Sub(x, ReduceMean(x, axes, keepdims=1)) whose mean feeds only such Subs of
  the same x: both read x - x₀ over those axes (x - mean(x) unchanged, exact zeros on a constant).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from modelport.ir import IRModel

NORMS = ("LayerNormalization", "GroupNormalization", "InstanceNormalization")
MIN_OPSET = 13  # Slice with inputs, ReduceMean with its axes attribute up to 17 (read either way)
PREFIX = "modelport_shift"


@dataclass
class Shifted:
    """The rewrite's result: the IR (the input itself when nothing was shifted), the nodes shifted
    ('LayerNormalization ln_1') and those left alone with the reason."""

    ir: IRModel
    nodes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def normalisations(model) -> list[str]:
    """The top-level nodes the rewrite looks at ('LayerNormalization ln_1', ...), read without copying
    the model: none means no screening is needed."""
    if model is None:
        return []
    graph = model.graph
    means = {o for n in graph.node if n.op_type == "ReduceMean" for o in n.output}
    return [_label(n, i) for i, n in enumerate(graph.node)
            if n.op_type in NORMS or (n.op_type == "Sub" and len(n.input) == 2 and n.input[1] in means)]


def shift(ir: IRModel) -> Shifted:
    """The IR with its normalisations fed x - x₀ (the module docstring); pure: `ir` is not changed."""
    import onnx

    opset = next((o.version for o in ir.model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not normalisations(ir.model):
        return Shifted(ir)
    if opset < MIN_OPSET:
        return Shifted(ir, skipped=[f"opset {opset} < {MIN_OPSET}: not rewritten"])
    model = onnx.ModelProto()
    model.CopyFrom(ir.model)
    writer = _Writer(model, _ranks(model))
    nodes = list(model.graph.node)
    out: list = []
    for i, node in enumerate(nodes):
        rewrite = {"LayerNormalization": writer.layer_norm, "GroupNormalization": writer.group_norm,
                   "InstanceNormalization": writer.instance_norm, "Sub": writer.centring}.get(node.op_type)
        after: list = []
        why = rewrite(node, out, after, nodes) if rewrite and node.domain in ("", "ai.onnx") else ""
        if why is None:
            writer.done.append(_label(node, i))
        elif why:
            writer.skipped.append(f"{_label(node, i)}: {why}")
        out.append(node)
        out.extend(after)
    if not writer.done:
        return Shifted(ir, skipped=writer.skipped)
    del model.graph.node[:]
    model.graph.node.extend(out)
    shifted = ir.clone(model)
    shifted.stored = ir.stored
    return Shifted(shifted, writer.done, writer.skipped)


def _label(node, i: int) -> str:
    return f"{node.op_type} {node.name or (node.output[0] if node.output else f'#{i}')}"


def _ranks(model) -> dict[str, int]:
    """Tensor name -> rank, from shape inference where it runs (models over 2 GB: what the graph
    declares), for the axes a rewrite needs."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    ranks = {}
    for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
            ranks[v.name] = len(v.type.tensor_type.shape.dim)
    ranks.update({t.name: len(t.dims) for t in model.graph.initializer})
    return ranks


class _Writer:
    """The nodes and constants one rewrite adds. Each method puts into `out` (the nodes before `node`)
    what computes the shifted input and into `after` what must follow `node`, points `node` at the
    shifted input and returns None; or returns why it left `node` alone ("" when it is no match)."""

    def __init__(self, model, ranks: dict[str, int]):
        self.model, self.ranks = model, ranks
        self.done: list[str] = []
        self.skipped: list[str] = []
        self.origin: dict[str, str] = {}  # a shifted tensor -> the tensor it shifts
        self.count = 0
        self.names = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input} | \
            {t.name for t in model.graph.initializer}

    def fresh(self, what: str) -> str:
        while True:
            self.count += 1
            name = f"{PREFIX}_{what}_{self.count}"
            if name not in self.names:
                self.names.add(name)
                return name

    def const(self, values, what: str) -> str:
        from onnx import numpy_helper

        name = self.fresh(what)
        self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def first(self, x: str, axes: list[int], out: list) -> str:
        """x[..., :1, ...] over `axes`: the first element of each group (dims kept, to broadcast)."""
        from onnx import helper

        s = self.fresh("first")
        out.append(helper.make_node("Slice", [x, self.const([0] * len(axes), "starts"), self.const([1] * len(axes), "ends"),
                                              self.const(axes, "axes")], [s], name=s))
        return s

    def less(self, x: str, s: str, out: list) -> str:
        from onnx import helper

        y = self.fresh("shifted")
        out.append(helper.make_node("Sub", [x, s], [y], name=y))
        self.origin[y] = x
        return y

    def layer_norm(self, node, out: list, after: list, nodes) -> str | None:
        from onnx import helper

        axis, rank = _attr(node, "axis", -1), self.ranks.get(node.input[0])
        if rank is None and axis >= 0:
            return "the input's rank is unknown"
        axes = list(range(axis, 0)) if rank is None else list(range(axis % rank, rank))
        s = self.first(node.input[0], axes, out)
        node.input[0] = self.less(node.input[0], s, out)
        if len(node.output) > 1 and node.output[1]:  # its Mean output stays the mean of x
            mean, node.output[1] = node.output[1], self.fresh("mean")
            after.append(helper.make_node("Add", [node.output[1], s], [mean], name=self.fresh("mean_of_x")))
        return None

    def group_norm(self, node, out: list, after: list, nodes) -> str | None:
        from onnx import helper

        groups = _attr(node, "num_groups", None)
        if groups is None:
            return "no num_groups"
        x = node.input[0]
        shape, grouped, back = self.fresh("shape"), self.fresh("grouped"), self.fresh("ungrouped")
        out.append(helper.make_node("Shape", [x], [shape], name=shape))
        out.append(helper.make_node("Reshape", [x, self.const([0, groups, -1], "groups")], [grouped], name=grouped))
        centred = self.less(grouped, self.first(grouped, [2], out), out)
        out.append(helper.make_node("Reshape", [centred, shape], [back], name=back))
        node.input[0] = back
        return None

    def instance_norm(self, node, out: list, after: list, nodes) -> str | None:
        rank = self.ranks.get(node.input[0])
        if rank is None or rank < 3:
            return "the input's rank is unknown" if rank is None else f"a rank-{rank} input"
        x = node.input[0]
        node.input[0] = self.less(x, self.first(x, list(range(2, rank)), out), out)
        return None

    def centring(self, node, out: list, after: list, nodes) -> str | None:
        """Sub(x, ReduceMean(x)): both read x - x₀, when the mean feeds nothing but such Subs of x."""
        if len(node.input) != 2:
            return ""
        x, mean = node.input
        producer = next((n for n in out if n.op_type == "ReduceMean" and mean in n.output), None)
        if producer is None or self.origin.get(producer.input[0], producer.input[0]) != x:
            return ""
        if producer.input[0] != x:  # shifted already, for an earlier Sub of the same mean
            node.input[0] = producer.input[0]
            return None
        readers = [n for n in nodes if mean in n.input]
        if any(r.op_type != "Sub" or list(r.input) != [x, mean] for r in readers) or \
                any(o.name == mean for o in self.model.graph.output):
            return "its mean is read elsewhere than by x - mean"
        if not _attr(producer, "keepdims", 1):
            return "ReduceMean without keepdims"
        axes = self.reduced_axes(producer)
        if isinstance(axes, str):
            return axes
        added: list = []
        shifted = self.less(x, self.first(x, axes, added), added)
        at = out.index(producer)
        out[at:at] = added
        producer.input[0] = shifted
        node.input[0] = shifted
        return None

    def reduced_axes(self, mean) -> list[int] | str:
        from onnx import numpy_helper

        axes = _attr(mean, "axes", None)
        if axes is None and len(mean.input) > 1 and mean.input[1]:
            init = next((t for t in self.model.graph.initializer if t.name == mean.input[1]), None)
            if init is None:
                return "its axes are computed at run time"
            axes = numpy_helper.to_array(init).tolist()
        if not axes:
            if _attr(mean, "noop_with_empty_axes", 0):
                return "ReduceMean reduces nothing"
            rank = self.ranks.get(mean.input[0])
            if rank is None:
                return "the input's rank is unknown"
            axes = list(range(rank))
        return [int(a) for a in axes]


def _attr(node, name: str, default):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
