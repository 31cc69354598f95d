"""Graph optimisation: `Pass` objects that turn an IRModel into an IRModel, and named levels.

A pass is pure: `apply(ir)` returns a `PassResult(model, modified, details)` and never mutates its
input, so the pipeline (`optimize/pipeline.py`) can re-run the result in onnxruntime, compare it
with the reference outputs and roll the pass back when parity breaks. Passes are looked up by the
name users type (`--passes fold,dce,fuse`); adding one is a module plus one line in `PASSES`
(or `register_pass(name, "module:Class")`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modelport.errors import BadInputError
from modelport.ir import IRModel
from modelport.registry import Registry

if TYPE_CHECKING:
    from modelport.validation import Tolerance


@dataclass
class PassResult:
    model: IRModel
    modified: bool
    details: dict[str, Any] = field(default_factory=dict)


class Pass:
    """Base class: subclasses set `name`, `description` and implement `apply`.

    `precision` is the numeric precision of what the pass produces; the pipeline picks the parity
    tolerance from it (fp32 passes are held to fp32 tolerances).

    `reads_stored`: the pass takes an IR whose large initializers are references to data files in
    `ir.stored` (`IRModel.park`), reads values from there, and returns such an IR (the references
    kept, new tensors in memory). The pipeline then keeps a large model's weights in files while the
    pass and its parity check run, so neither the pass's input nor its result holds them; other
    passes are given the weights in memory.

    `float_weights`: the pass starts from a float graph: a quantised IR's integer weights are
    dequantised before it (`optimize/dequantize.py`, put in by `optimize_ir`). The FP16 converter
    and onnxruntime's INT8 quantiser cannot take a DequantizeLinear on a weight.

    `gate_tolerance`: set by the pipeline before `apply` to the tolerance its parity gate will
    hold the result to; a precision pass whose own fallback keeps nodes in float aims at it.
    """

    name = ""
    description = ""
    precision = "fp32"
    reads_stored = False
    float_weights = False
    gate_tolerance: Tolerance | None = None

    def apply(self, ir: IRModel) -> PassResult:
        raise NotImplementedError

    def __call__(self, ir: IRModel) -> PassResult:
        return self.apply(ir)

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


# name users type -> "module:Class"
PASSES = Registry("pass", {
    "shape": "modelport.optimize.shape_inference:ShapeInferencePass",
    "fold": "modelport.optimize.folding:ConstantFoldingPass",
    "dce": "modelport.optimize.folding:DeadCodeEliminationPass",
    "cleanup": "modelport.optimize.cleanup:RedundantOpsPass",
    "fuse": "modelport.optimize.fusion:FusionPass",
    "simplify": "modelport.optimize.simplify:OnnxSimPass",
    "transformer": "modelport.optimize.transformer_fusion:TransformerFusionPass",
    "transformer-sln": "modelport.optimize.transformer_fusion:SkipLayerNormTransformerFusionPass",
    "dequantize": "modelport.optimize.dequantize:DequantizeWeightsPass",
    "fp16": "modelport.optimize.precision:Float16Pass",
    "int8-dynamic": "modelport.optimize.quantize:DynamicQuantizationPass",
    "int8-static": "modelport.optimize.quantize:StaticQuantizationPass",
})
register_pass = PASSES.register

# Named levels: what `--optimize LEVEL` runs (FP32 passes only; precision is its own option).
LEVELS: dict[str, list[str]] = {
    "none": [],
    "basic": ["shape", "fold", "dce", "cleanup"],
    "extended": ["shape", "fold", "dce", "cleanup", "fuse", "simplify"],
    # transformer before simplify: onnxsim drops the exporter's symbolic shapes, which the
    # attention rules need on dynamic-shape exports (see optimize/attention_fusion.py)
    "all": ["shape", "fold", "dce", "cleanup", "fuse", "transformer", "simplify"],
}
LEVEL_NAMES = (*LEVELS, "auto")
PRECISIONS = ("fp32", "fp16", "int8", "int8-dynamic", "int8-static")


def get_pass(name: str, **options) -> Pass:
    if name not in PASSES:
        raise BadInputError(f"unknown pass '{name}'; known: {', '.join(PASSES)}")
    return PASSES.load(name)(**options)


def passes_for_level(level: str) -> list[str]:
    if level not in LEVELS:
        raise BadInputError(f"unknown optimisation level '{level}'; known: {', '.join(LEVEL_NAMES)}")
    return list(LEVELS[level])


def parse_pass_list(text: str) -> list[str]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise BadInputError(f"unknown pass(es) {', '.join(repr(n) for n in unknown)}; known: {', '.join(PASSES)}")
    return names
