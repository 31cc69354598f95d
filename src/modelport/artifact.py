"""What an emitter wrote: one artifact, with how to run it and, where it cannot be run here, why.

It sits in the base layer so that the stages above (emitters, which make it) and below
(`validation/artifact.py`, which validates it) share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict


class ArtifactDetails(TypedDict, total=False):
    """`Artifact.details`: what an emitter says of its artifact, in the artifact's report entry beside
    the target, runtime, precision and files (`Artifact.to_dict`; the report schema's `artifacts`
    items). A plain dict at run time; each key is written by the emitters named in its comment."""

    # how it was made (most targets)
    converter: str  # the converter chain that wrote it, with versions
    validation: str  # how the validation loads, feeds and reads it, in words
    format: str  # the file format (ort, mlpackage, openvino-ir, the TF.js graph model's)
    nodes: int  # the graph's node count (onnx, ort, ort-genai, tfjs)
    opset: int | None  # the ONNX default-domain opset (onnx, ort-genai)
    preflight: dict[str, Any]  # the target's preflight: ops it lacks or changes (ort, tflite, tensorrt)
    quantization: str  # how it is quantised, in words ("none" when not) (tflite, executorch)
    weights: str  # the weights' storage precision (openvino: fp32/fp16/int8; tfjs: float32, float16, uint8)
    # I/O as the file has it
    signature: dict[str, Any]  # the signature it is called by: key, inputs, outputs (tflite, savedmodel; tfjs: inputs, outputs)
    layout: str  # the tensor layout it was written in ("source", or "nhwc") (tflite)
    inputs_layout: dict[str, str | None]  # input -> its layout in the file (tflite, savedmodel, tfjs)
    outputs_layout: dict[str, str | None]  # output -> its layout in the file (tflite, savedmodel, tfjs)
    layout_changes: dict[str, list[int]]  # tensor -> the permutation from the contract's layout to the file's (tflite nhwc)
    io_dtype: str | None  # the dtype its inputs and outputs are fed and read at (tflite's full-integer I/O; coreml)
    io_dtypes: dict[str, str]  # tensor -> the dtype the format keeps it at where not the contract's (coreml: int64 as int32)
    io_names: dict[str, str]  # contract name -> the name the format gave it where they differ (coreml)
    fixed_dims: dict[str, dict[str, int]]  # tensor -> dim -> the size a dynamic dim was fixed at (executorch, coreml, tflite via PyTorch)
    dims: dict[str, dict[str, dict[str, Any]]]  # input -> dim -> kept with its bounds, fixed at a size or dynamic (dims.input_dims)
    # TFLite (emitters/tflite*.py)
    tflite_ops: int  # the operators in the flatbuffer
    source_signature: str | None  # re-emission: the key of the source file's signature it replaced (None: it had none)
    quantized_ops: list[str] | None  # re-emission: the ops ai-edge-quantizer quantised
    signatures: list[dict[str, Any]]  # litert-torch: one signature per listed size: key, dims
    route_steps: list[str]  # the steps of the route through modelport's PyTorch code (tflite from ONNX by litert-torch)
    # TF.js (emitters/tfjs.py, tfjs_graph.py)
    saved_model: str | None  # the converter of the SavedModel the graph model was written from
    shards: int  # the weight shard files
    weight_bytes: int  # the bytes of the weights over all shards
    grappler: list[str]  # the grappler passes run on the frozen graph, in order
    rewritten: dict[str, int]  # op TF.js lacks -> nodes rewritten with ops it has (Erfc as 1 - Erf)
    # ExecuTorch (emitters/executorch.py)
    backend: str  # the backend lowered to (xnnpack, portable)
    delegated_partitions: int  # the partitions delegated to the backend
    portable_ops: list[str]  # the ops left to the runtime's portable kernels
    methods: dict[str, Any]  # the program's methods: forward's calling convention, the input and output names
    kernel_fallback: dict[str, Any]  # the rewrite that kept a kernel off the reference's constant frames: what, why, judged with (emitters/norm_fallback.py)
    # Core ML (emitters/coreml.py)
    model_type: str  # the Core ML model type (mlProgram)
    spec_version: int  # the Core ML specification version
    coremltools: str  # the coremltools version
    deployment_target: str  # the minimum deployment target (iOS16, macOS13, …)
    compute_precision: str  # the precision Core ML computes at
    export_attempts: list[dict[str, Any]]  # each conversion route tried: route, ok, reason
    # TensorRT (emitters/tensorrt.py)
    plan_only: bool  # --plan-only: the build plan written and no engine built
    check: dict[str, Any]  # the static check of the graph against TensorRT's ONNX parser
    plan: dict[str, Any]  # the build plan: precision, workspace, its files, the shape profiles
    trtexec: dict[str, str]  # TensorRT major version -> the trtexec command that builds the engine
    tensorrt: str | None  # the TensorRT version that built the engine (None: not built)
    gpu: str | None  # the GPU the engine was built on
    compute_capability: str | None  # that GPU's compute capability ("8.9")
    major: int | None  # the TensorRT major version installed here
    # OpenVINO (emitters/openvino.py, optimize/openvino_precision.py)
    openvino: str  # the OpenVINO version
    route: str  # the conversion path in words (the report entry's `route` then says native or onnx in its place)
    inference_precision: str  # the precision OpenVINO is asked to run it at (the report entry's is the one its validation reads back)
    int8_mode: str  # INT8: weights (weight compression) or static (calibrated quantisation)
    quantizer: str  # INT8: the NNCF call that quantised it
    calibration_samples: int  # static INT8: the calibration samples
    max_drop: float  # static INT8 under an accuracy budget: the drop NNCF's accuracy control allowed
    # ONNX Runtime (emitters/ort.py, ort_genai.py)
    onnxruntime: str  # the onnxruntime version that wrote the ORT file
    optimization: str  # the graph optimisation level applied when saving (basic)
    file_layout: str  # the ORT file's layout ("canonical", or why not)
    tokenizer: bool  # ort-genai: tokenizer.json copied into the folder
    # PyTorch code (emitters/pytorch_code)
    parameters: int  # the parameters in the weights file
    lines: int  # the lines of the generated model.py


@dataclass
class Artifact:
    """What an emitter wrote: the target, the runtime that runs it, its files and precision."""

    target: str
    runtime: str
    path: Path  # the main file (or folder)
    files: list[Path]
    precision: str = "fp32"
    details: ArtifactDetails = field(default_factory=ArtifactDetails)
    # how to run it: a runtimes/ name and options, or None when no runtime here can (e.g. no GPU)
    runner: str | None = None
    runner_options: dict[str, Any] = field(default_factory=dict)
    # why it cannot be validated here (Core ML off macOS, a TensorRT plan without an engine), or None.
    # The pipeline then checks what it can (with a runner: its I/O against the contract, from the
    # runner's input/output specs, nothing run), records `validated: false` with this reason, warns,
    # and fails the run under --strict (exit 4).
    not_validated: str | None = None
    # the data to validate it with when the emitter judged it on other data than the IR's
    # references (a model calibrated for INT8 is judged on its calibration data); None: the IR's
    reference: Any = None
    # what the emitter chose for the user that they should hear of (a kernel kept out of a delegate);
    # the pipeline warns with them once the artifact has passed its validation
    warnings: list[str] = field(default_factory=list)

    def to_dict(self, root: Path | None = None) -> dict[str, Any]:
        from modelport.run.staging import describe_files  # shutil, tempfile: not at CLI start-up

        return {"target": self.target, "runtime": self.runtime, "precision": self.precision,
                **describe_files(self.path, self.files, root), **self.details}
