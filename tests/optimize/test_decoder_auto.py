"""Decoder variants for `--optimize auto` (optimize/decoder_auto.py): what is built, what a variant that cannot be built
records, how long the timed generation is. Choosing among real decoders is tested end to end in
tests/orchestration/test_text_generation.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from modelport.errors import BadInputError
from modelport.optimize.decoder_auto import DecoderAutoOptions, bench_lengths, build_variants
from modelport.optimize.weight_only import BITS, WeightOnlyOptions, quantize_weight_only
from tests.optimize.conftest import make_ir


def _quantize(model, precision):
    return quantize_weight_only(model, WeightOnlyOptions(bits=BITS[precision], block_size=32))


def _matmul_model():
    w = np.random.default_rng(0).standard_normal((64, 32)) * 0.1
    return make_ir([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, 64])], [("y", [1, 32])], {"w": w}).model


def test_variants_are_unfused_and_fused_per_precision_fused_before_quantised():
    fused_inputs = []

    def fuse(model):  # a stand-in for onnxruntime's fusions: renames the node, so the fused base is recognisable
        fused_inputs.append(model)
        from onnx import ModelProto

        out = ModelProto()
        out.CopyFrom(model)
        out.graph.node[0].name = "fused"
        return out, {"fused": {"MatMul": 1}}

    model = _matmul_model()
    variants, fusion = build_variants(model, ("fp32", "int4"), _quantize, fuse=fuse)
    assert [(v.name, v.precision, v.fused) for v in variants] == [("fp32", "fp32", False), ("fp32-fused", "fp32", True),
                                                                   ("int4", "int4", False), ("int4-fused", "int4", True)]
    assert fused_inputs == [model] and fusion == {"fused": {"MatMul": 1}}  # fused once, shared by every precision
    assert variants[0].model is model and variants[1].model.graph.node[0].name == "fused"
    assert [n.op_type for n in variants[3].model.graph.node] == ["MatMulNBits"] and variants[3].row["quantized"] == 1
    assert variants[3].model.graph.node[0].name.startswith("fused")


def test_a_variant_that_cannot_be_built_is_kept_in_the_table_with_its_reason():
    def fuse(model):
        raise RuntimeError("pattern not found\nsecond line")

    variants, fusion = build_variants(_matmul_model(), ("int8",), _quantize, fuse=fuse)
    unfused, fused = variants
    assert unfused.model is not None and unfused.row["nodes"] == 1 and "reason" not in unfused.row
    assert fused.model is None and fused.row["reason"] == "fusion failed: RuntimeError: pattern not found"
    assert fusion == {"error": "RuntimeError: pattern not found"}


def test_a_precision_that_cannot_be_quantised_is_recorded():
    relu = make_ir([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 8])], [("y", [1, 8])]).model
    variants, _ = build_variants(relu, ("int4",), _quantize, fuse=lambda m: (m, {}))
    assert all(v.model is None and v.row["reason"].startswith("quantisation failed: no MatMul with a constant weight")
               for v in variants)


@pytest.mark.parametrize("context,expected", [(4096, (128, 32)), (64, (31, 32)), (20, (1, 18)), (2, (1, 1))])
def test_the_timed_generation_fits_the_models_positions(context, expected):
    assert bench_lengths(DecoderAutoOptions(), context) == expected


@pytest.mark.parametrize("field,value", [("prompt_tokens", 0), ("decode_steps", 0), ("rounds", 0), ("warmup", -1)])
def test_bad_timing_options_are_exit_2(field, value):
    with pytest.raises(BadInputError, match=f"bad decoder auto {field}"):
        DecoderAutoOptions(**{field: value})
