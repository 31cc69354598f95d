"""`modelport emit MODEL.onnx --to TARGET -o OUT`: an ONNX file to deployment artifacts, each validated.

The ONNX model is the reference (onnxruntime runs it on generated or given inputs); every
artifact is checked against those outputs, as `convert` does for framework sources.
"""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import choice, run, split_list, stage_status
from modelport.emitters import EMITTERS
from modelport.errors import BadInputError


def register(app: typer.Typer) -> None:
    @app.command("emit")
    def emit_cmd(
        model: str = typer.Argument(..., help="ONNX model file."),
        to: flags.Targets = ...,
        output: flags.OutputDir = None,
        inputs: flags.Inputs = [],
        dim: flags.Dim = [],
        precision: flags.EmitPrecision = "fp32",
        calibration: flags.Calibration = None,
        plan_only: flags.PlanOnly = False,
        tflite_layout: flags.TFLiteLayout = "source",
        tflite_io_dtype: flags.TFLiteIODtype = "float32",
        trt_shapes: flags.TRTShapes = [],
        workspace: flags.Workspace = None,
        atol: flags.Atol = [],
        rtol: flags.Rtol = [],
        min_cosine: flags.MinCosine = [],
        allow_fallback: flags.AllowFallback = False,
        strict: flags.Strict = False,
        seed: flags.Seed = 0,
        force: flags.Force = False,
        json_out: flags.JsonOut = False,
        quiet: flags.Quiet = False,
    ):
        """Emit deployment artifacts (TFLite, TensorRT, ORT format) from an ONNX model, each validated."""

        def body():
            from modelport.emitters.tensorrt import TensorRTOptions
            from modelport.emitters.tflite import TFLiteOptions
            from modelport.orchestration import ConvertOptions, convert
            from modelport.specs import parse_dims, parse_input_spec
            from modelport.validation import parse_tolerance_flags

            if not output:
                raise BadInputError("no output folder", hint="pass -o OUT_DIR")
            targets = [choice(t, EMITTERS, "target") for t in split_list(to)]
            tols, per_output = parse_tolerance_flags(atol=atol, rtol=rtol, min_cosine=min_cosine)
            options = ConvertOptions(
                targets=targets, framework="onnx", inputs=[parse_input_spec(t) for t in inputs],
                **tols, output_tolerances=per_output, allow_precision_fallback=allow_fallback, strict=strict,
                precision=choice(precision, flags.EMIT_PRECISIONS, "precision"), seed=seed,
                sample_dims=parse_dims(dim), force=force, calibration=calibration, command="emit",
                tflite=TFLiteOptions(layout=tflite_layout, io_dtype=tflite_io_dtype),
                tensorrt=TensorRTOptions(plan_only=plan_only, shapes=trt_shapes, workspace=workspace),
            )
            with stage_status(quiet or json_out) as on_stage:
                return convert(model, output, options, on_stage=on_stage)

        from modelport.cli.render import render_report

        run(body, command="emit", json_out=json_out, quiet=quiet, render=lambda r: render_report(r, output))
