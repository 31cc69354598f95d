"""Attention fusion into onnxruntime's contrib ops, on top of onnxscript's `ort_fusions`.

onnxscript fuses attention in three steps: the softmax(Q·Kᵀ·scale + mask)·V subgraph becomes a
temporary `SDPA` node; `SDPA` with the head split/merge around it (Reshape to (B,S,H,Dh), Transpose
to (B,H,S,Dh), and back) becomes `com.microsoft.MultiHeadAttention` on (B,S,D) tensors; when Q, K
and V are MatMuls of one input plus a bias, that becomes `com.microsoft.Attention` with one packed
(D, 3D) weight. On `torch.onnx` dynamo exports of transformers BERT/GPT-2 two things go wrong,
and the two rules here fix them:

* `MultiHeadAttentionReshapeBack` — onnxscript's MHA rule replaces the final head-merge Reshape by
  the MHA output, which is (B,S,D). After simplification that Reshape often goes straight to
  another shape — GPT-2's Conv1D flattens to (B·S, D) for its Gemm — and the fused model is then
  unloadable ("Gemm input 0 expected to have rank 2"), so the pass used to be rolled back. This
  rule re-applies the original Reshape target to the MHA output whenever it is not (B,S,D).
  With a KV cache (past Concat before SDPA) the MHA has three outputs (attention, present key,
  present value); only the first is reshaped.
  Reshape only reinterprets the row-major buffer, and (B,S,H,Dh) and (B,S,H·Dh) share it, so
  Reshape(MHA(q,k,v), shape) equals Reshape(Transpose(SDPA), shape).
* `ZeroBiasMultiHeadAttention` — randomly initialised (and some trained) models have all-zero
  Q/K/V biases, which simplification removes (x + 0 = x); onnxscript then never packs Q/K/V into
  `Attention`, which needs a bias input. This rule gives such an MHA an explicit zero bias when
  Q, K and V are MatMuls of one input with constant weights, so the `Attention` rule can pack them
  (one (D, 3D) GEMM instead of three (D, D) ones).

The rules match on value shapes: the SDPA rule needs Q, K and V to share batch, head-count and
head-size dims. onnx-simplifier drops the exporter's symbolic shapes, and onnx's own shape
inference then cannot tell that the `-1` head count of each head-split Reshape (target
`Concat(Shape(x)[:2], [-1], [Dh])`) is the same number, so it names Q's, K's and V's head counts
differently (`unk__10` vs `unk__11`) and nothing fuses. `fill_symbolic_shapes` therefore first runs
onnxruntime's symbolic shape inference (sympy arithmetic on dims: B·S·64 / (B·S·16) = 4) and
gives its dims to the ones onnx leaves unknown or anonymous, and spells equal dim expressions
alike (`past_sequence + sequence` / `sequence + past_sequence` on a KV-cache export). These
shapes guide the matching (and the optimizer's folding during it) and are put back afterwards,
so the output model carries onnx's own shapes and the export's I/O shapes.

`fuse_transformer(model)` runs onnxscript's fusion sequence (the one `optimize_for_ort` runs) with
these rules in place of the upstream MHA step, and returns the fusion counts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from onnxscript.rewriter import _fusion_utils, pattern
from onnxscript.rewriter.ort_fusions import mha, mha_bias

from modelport.optimize.exact_rules import exact_default_rules


def _same_dim(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a.value is not None and a.value == b.value


class MultiHeadAttentionReshapeBack(mha.MultiHeadAttention):
    def check(self, op, query_BSD, attention_reshaped=None, **bindings):
        result = super().check(op, query_BSD, **bindings)
        if not result:
            return result
        reshape = attention_reshaped.producer()
        out_shape, bsd = attention_reshaped.shape, query_BSD.shape
        self._reshape_to = None
        if (out_shape is not None and bsd is not None and len(out_shape) == len(bsd)
                and all(_same_dim(a, b) for a, b in zip(out_shape, bsd, strict=True))):
            return result
        shape = reshape.inputs[1]
        allowzero = reshape.attributes.get_int("allowzero", 0)
        if not allowzero:
            # Reshape's 0 copies the input's dim; only B and S sit at the same position in the
            # (B,S,H,Dh) input of the original Reshape and the (B,S,D) output of MHA.
            const = shape.const_value
            if const is None:
                return result.fail("head-merge Reshape has a computed shape with allowzero=0", shape)
            if any(d == 0 for d in const.numpy().reshape(-1)[2:].tolist()):
                return result.fail("head-merge Reshape copies a head dim (0 past axis 1)", shape)
        self._reshape_to = (shape, allowzero)
        return result

    def rewrite(self, op, *args, **bindings):
        out = super().rewrite(op, *args, **bindings)
        if out is None or self._reshape_to is None:
            return out
        shape, allowzero = self._reshape_to
        if isinstance(out, tuple):  # with past/present: (attention, present_key, present_value)
            return (op.Reshape(out[0], shape, allowzero=allowzero), *out[1:])
        return op.Reshape(out, shape, allowzero=allowzero)


class ZeroBiasMultiHeadAttention(mha_bias.FuseBiasMHA):
    def check(self, context, query_matmul, key_matmul, value_matmul, has_q_bias, has_k_bias, has_v_bias,
              **bindings):
        result = pattern.MatchResult()
        if has_q_bias or has_k_bias or has_v_bias:
            return result.fail("Q/K/V have a bias: the upstream bias rule handles this MHA")
        producers = [v.producer() for v in (query_matmul, key_matmul, value_matmul)]
        if any(p is None or p.op_type != "MatMul" or p.domain not in ("", "ai.onnx") for p in producers):
            return result.fail("Q, K and V are not all MatMul outputs")
        if len({id(p.inputs[0]) for p in producers}) != 1:
            return result.fail("Q, K and V are not projections of one input (cross-attention)")
        if any(p.inputs[1].const_value is None for p in producers):
            return result.fail("a Q/K/V weight is not a constant")
        return super().check(context, query_matmul, key_matmul, value_matmul,
                             has_q_bias=True, has_k_bias=True, has_v_bias=True, **bindings)


def _mha_rules(has_past_present: bool) -> pattern.RewriteRuleSet:
    combos = [(rotary, cross) for rotary in (False, True)
              for cross in ((False,) if has_past_present else (False, True))]
    return pattern.RewriteRuleSet([
        MultiHeadAttentionReshapeBack.rule(
            f"MHA{'_Rotary' if rotary else ''}{'_Past' if has_past_present else ''}"
            f"{'_CrossAttention' if cross else ''}_ReshapeBack",
            is_rotary=rotary, has_past_present=has_past_present, is_cross_attention=cross)
        for rotary, cross in combos
    ])


fuse_mha_with_past = _fusion_utils.apply_fusion_rules(_mha_rules(True))
fuse_mha_no_past = _fusion_utils.apply_fusion_rules(_mha_rules(False))
fuse_zero_bias_mha = _fusion_utils.apply_fusion_rules(pattern.RewriteRuleSet([ZeroBiasMultiHeadAttention.rule()]))


def fuse_transformer(model, *, skip_layer_norm: bool = True) -> dict[str, int]:
    """Transformer fusions on an onnx_ir Model, in place; returns {fusion: count}.

    onnxscript's optimizer runs with exact no-op rules: its own drop an epsilon such as a
    decomposed LayerNorm's 1e-12 as if it were `+ 0` (optimize/exact_rules.py)."""

    with exact_default_rules():
        return _fuse_transformer(model, skip_layer_norm=skip_layer_norm)


def _fuse_transformer(model, *, skip_layer_norm: bool) -> dict[str, int]:
    import onnx_ir as ir
    import onnx_ir.passes.common as common
    from onnxscript.optimizer import optimize
    from onnxscript.rewriter import rewrite
    from onnxscript.rewriter.ort_fusions import _core
    from onnxscript.rewriter.ort_fusions.attention import fuse_attention
    from onnxscript.rewriter.ort_fusions.bias_gelu import fuse_bias_gelu
    from onnxscript.rewriter.ort_fusions.cos_sin_cache import fuse_cos_sin_cache
    from onnxscript.rewriter.ort_fusions.erfgelu import fuse_erfgelu
    from onnxscript.rewriter.ort_fusions.gelu import fuse_gelu
    from onnxscript.rewriter.ort_fusions.gqa import fuse_gqa
    from onnxscript.rewriter.ort_fusions.gqa_packed_qkv import fuse_qkv_gqa
    from onnxscript.rewriter.ort_fusions.mha_bias import fuse_mha_bias
    from onnxscript.rewriter.ort_fusions.mha_scale import fuse_mha_scale
    from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
    from onnxscript.rewriter.ort_fusions.rotary_embedding import fuse_partial_rotary_embedding, fuse_rotary_embedding
    from onnxscript.rewriter.ort_fusions.sdpa import fuse_sdpa
    from onnxscript.rewriter.ort_fusions.sdpa_via_mha import replace_sdpa_by_mha
    from onnxscript.rewriter.ort_fusions.skip_normalization import (
        fuse_skip_layer_normalization,
        fuse_skip_rms_normalization,
    )
    from onnxscript.rewriter.rules.common import _gemm_to_matmul_add

    rewrite(model, [_gemm_to_matmul_add.gemm_to_matmul_add_rule])
    counts: dict[str, int] = {}
    restore_shapes = fill_symbolic_shapes(model)

    def run(key, fn, **kw):
        counts[key] = counts.get(key, 0) + fn(model, **kw)

    _core._pre_optimize(model)

    run("erf_gelu", fuse_erfgelu)
    run("rms_normalization", fuse_rms_normalization)
    if skip_layer_norm:
        run("skip_layer_normalization", fuse_skip_layer_normalization)
        run("skip_rms_normalization", fuse_skip_rms_normalization)
    run("rotary_embedding", fuse_rotary_embedding)
    run("cos_sin_cache", fuse_cos_sin_cache)
    common.CommonSubexpressionEliminationPass()(model)
    run("partial_rotary_embedding", fuse_partial_rotary_embedding)
    run("sdpa", fuse_sdpa, apply_shape_inference=True)
    run("gqa", fuse_gqa)
    run("packed_qkv_for_gqa", fuse_qkv_gqa)
    run("mha", fuse_mha_with_past)
    run("mha", fuse_mha_no_past)
    run("mha_scale", fuse_mha_scale)
    if counts["mha"]:
        run("mha_bias", fuse_mha_bias)
        run("mha_zero_bias", fuse_zero_bias_mha)
        run("attention", fuse_attention)
    run("gelu", fuse_gelu)
    run("bias_gelu", fuse_bias_gelu)
    run("sdpa_via_mha", replace_sdpa_by_mha)
    optimize(model)
    restore_shapes()
    _fold_weight_concats(model)
    rewrite(model, _core.ORT_PATTERN_REWRITE_RULES)
    ir.passes.Sequential(
        common.LiftConstantsToInitializersPass(lift_all_constants=False, size_limit=1),
        common.RemoveInitializersFromInputsPass(),
        common.ShapeInferencePass(),
    )(model)
    return counts


def _fold_weight_concats(model) -> None:
    """Fold Concat of constant weights (the packed (D, 3D) QKV weight of `Attention`) into one
    initializer; the optimizer leaves it as a node because it is over its folding size limit."""
    import numpy as np
    import onnx_ir as ir

    graph = model.graph
    for node in list(graph):
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            continue
        if any(v is None or v.const_value is None for v in node.inputs):
            continue
        axis = node.attributes.get_int("axis", 0)
        out = node.outputs[0]
        folded = ir.Value(name=out.name, shape=out.shape, type=out.type, const_value=ir.tensor(
            np.concatenate([v.const_value.numpy() for v in node.inputs], axis=axis), name=out.name))
        out.replace_all_uses_with(folded)
        graph.remove(node, safe=True)
        graph.register_initializer(folded)


def _anonymous_dim(d) -> bool:
    return not isinstance(d, int) and (d.value is None or d.value.startswith("unk__"))


_TERM = re.compile(r"\d+|[A-Za-z_]\w*")


def canonical_dim_name(name: str) -> str:
    """One spelling for a symbolic dim that is a sum of products of names and integers.

    torch.onnx names such dims after sympy expressions and does not always order them alike:
    the present key and value of one layer can be `past_sequence + sequence` and
    `sequence + past_sequence`. Other names are returned unchanged (this parses, never evaluates).
    """
    if "+" not in name and "*" not in name:
        return name
    terms = []
    for term in name.split("+"):
        factors = [f.strip() for f in term.split("*")]
        if not all(_TERM.fullmatch(f) for f in factors):
            return name
        coeff = math.prod(int(f) for f in factors if f.isdigit())
        names = sorted(f for f in factors if not f.isdigit())
        terms.append("*".join(([str(coeff)] if coeff != 1 or not names else []) + names))
    return " + ".join(sorted(terms))


def fill_symbolic_shapes(model) -> Callable[[], None]:
    """Make the shapes say what the fusion rules need to know, and return a function that puts
    the model's own shapes back.

    Symbolic dims that are the same expression get one spelling (`canonical_dim_name`). Dims that
    onnx's shape inference leaves unknown or anonymous (`unk__N`) get the ones onnxruntime's
    symbolic shape inference derives, as far as it gets (past an op it does not know, values stay
    as they are). It merges two symbolic dims that meet in a broadcast (it cannot know that
    neither is 1), which is why only the dims onnx cannot name are taken from it, and why all of
    this is matching evidence that is not kept in the output model.
    """
    import logging

    import onnx_ir as ir
    import onnx_ir.passes.common as common
    from onnx_ir.passes.common import _c_api_utils
    from onnxruntime.tools import symbolic_shape_infer as ssi

    graph = model.graph
    values = ir.convenience.create_value_mapping(graph)
    originals = {v: (v.shape, v.type) for v in values.values()}
    outputs = [(v.shape, v.type) for v in graph.outputs]

    def restore():
        for value, (shape, type_) in originals.items():
            value.shape, value.type = shape, type_
        for value, (shape, type_) in zip(graph.outputs, outputs, strict=True):
            value.shape, value.type = shape, type_

    def canonical(shape):
        return ir.Shape([d if isinstance(d, int) or d.value is None else canonical_dim_name(d.value)
                         for d in shape])

    for value in values.values():
        if value.shape is not None:
            value.shape = canonical(value.shape)
    common.ShapeInferencePass()(model)

    def infer(proto):
        # `SymbolicShapeInference.infer_shapes` without its last step, which writes the model
        # into the working directory and raises when some shape stays unknown; the shapes it did
        # derive are kept.
        inference = ssi.SymbolicShapeInference(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess rank, verbose
        inference._preprocess(proto)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
        return inference.out_mp_

    log = logging.getLogger(ssi.__name__)
    level = log.level
    log.setLevel(logging.CRITICAL)  # "potential unsafe merge" warnings about the evidence above
    try:
        found = ir.convenience.create_value_mapping(
            ir.serde.deserialize_model(_c_api_utils.call_onnx_api(infer, model)).graph)
    except Exception:  # sympy, onnx and assertion errors from an inference that is best effort
        found = {}
    finally:
        log.setLevel(level)
    io = {id(v) for v in (*graph.inputs, *graph.outputs)}
    for name, value in values.items():
        new = found.get(name)
        if id(value) in io or value.const_value is not None or new is None or new.shape is None:
            continue
        old, new_shape = value.shape, canonical(new.shape)
        if old is None:
            dims = list(new_shape)
        elif old.rank() == new_shape.rank():
            dims = [n if _anonymous_dim(o) else o for o, n in zip(old, new_shape, strict=True)]
        else:
            continue
        if value.type is not None and new.type is not None and value.type != new.type:
            continue
        value.shape = ir.Shape(dims)
        if value.type is None:
            value.type = new.type
    return restore
