"""`modelport emit MODEL.onnx --to TARGET -o OUT`: an ONNX file to deployment artifacts, each validated.

The ONNX model is the reference (onnxruntime runs it on generated or given inputs); every
artifact is checked against those outputs, as `convert` does for framework sources.
"""

from __future__ import annotations

import typer

from modelport.cli._common import EMIT_PRECISIONS, choice, run, split_list, stage_status
from modelport.emitters import EMITTERS
from modelport.errors import BadInputError


def emit_options(*, plan_only: bool = False, tflite_layout: str | None = None, trt_shapes: list[str] | None = None,
                 workspace: int | None = None, calibration: str | None = None, tflite_io_dtype: str | None = None) -> dict:
    """The emitter options the deployment targets read (EmitOptions.options)."""
    out: dict = {}
    if plan_only:
        out["plan_only"] = True
    if tflite_layout:
        layout = tflite_layout.lower()
        if layout not in ("source", "nhwc"):
            raise BadInputError(f"--tflite-layout '{tflite_layout}': choose source or nhwc")
        out["tflite_layout"] = layout
    if trt_shapes:
        from modelport.emitters.trt_plan import parse_shapes_option

        parse_shapes_option(trt_shapes)  # syntax errors before any work
        out["trt_shapes"] = list(trt_shapes)
    if workspace is not None:
        if workspace < 1:
            raise BadInputError("--workspace must be a positive number of MiB")
        out["workspace"] = workspace
    if calibration:
        out["calibration"] = calibration
    if tflite_io_dtype and tflite_io_dtype.lower() != "float32":
        if tflite_io_dtype.lower() not in ("int8", "uint8"):
            raise BadInputError(f"--tflite-io-dtype '{tflite_io_dtype}': choose float32, int8 or uint8")
        out["tflite_io_dtype"] = tflite_io_dtype.lower()
    return out


def register(app: typer.Typer) -> None:
    @app.command("emit")
    def emit_cmd(
        model: str = typer.Argument(..., help="ONNX model file."),
        to: list[str] = typer.Option(..., "--to", help=f"Target(s), comma-separated or repeated: {', '.join(EMITTERS)}."),
        output: str | None = typer.Option(None, "-o", "--output-dir", help="Output folder."),
        inputs: list[str] = typer.Option([], "--input", "-i", help="NAME:SHAPE[:DTYPE] to override the model's input spec."),
        dim: list[str] = typer.Option([], "--dim", help="Size of a symbolic dim in sample data, e.g. batch=4."),
        precision: str = typer.Option("fp32", "--precision", help="fp32, fp16 or int8 (TensorRT: fp32, fp16, best)."),
        calibration: str | None = typer.Option(None, "--calibration", help="INT8 calibration data: .npz of named inputs or a folder of images."),
        plan_only: bool = typer.Option(False, "--plan-only", help="TensorRT: check and write the build plan without building."),
        tflite_layout: str = typer.Option("source", "--tflite-layout", help="TFLite I/O layout: source (the contract's) or nhwc (channels-last inputs and outputs)."),
        tflite_io_dtype: str = typer.Option("float32", "--tflite-io-dtype", help="Full-integer TFLite I/O type: float32, int8 or uint8."),
        trt_shapes: list[str] = typer.Option([], "--trt-shapes", help="TensorRT profile NAME:MIN:OPT:MAX (repeatable)."),
        workspace: int | None = typer.Option(None, "--workspace", help="TensorRT workspace limit in MiB."),
        atol: list[str] = typer.Option([], "--atol", help="Absolute tolerance (scaled by each output's magnitude), e.g. 1e-4; OUTPUT=VALUE for one output (repeatable, comma-separated)."),
        rtol: list[str] = typer.Option([], "--rtol", help="Relative tolerance, e.g. 1e-3; OUTPUT=VALUE for one output (repeatable, comma-separated)."),
        min_cosine: list[str] = typer.Option([], "--min-cosine", help="Minimum cosine similarity, e.g. 0.999; OUTPUT=VALUE for one output (repeatable, comma-separated)."),
        allow_fallback: bool = typer.Option(False, "--allow-precision-fallback", help="Accept FP32 artifacts when --precision cannot be delivered within tolerance (else exit 4)."),
        strict: bool = typer.Option(False, "--strict", help="A model output that ignores its input fails the run (exit 4)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the sample inputs."),
        force: bool = typer.Option(False, "--force", help="Replace an existing output folder."),
        json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q"),
    ):
        """Emit deployment artifacts (TFLite, TensorRT, ORT format) from an ONNX model, each validated."""

        def body():
            from modelport.orchestration import ConvertOptions, convert
            from modelport.specs import parse_dims, parse_input_spec
            from modelport.validation import parse_tolerance_flags

            if not output:
                raise BadInputError("no output folder", hint="pass -o OUT_DIR")
            targets = [choice(t, EMITTERS, "target") for t in split_list(to)]
            choice(precision, EMIT_PRECISIONS, "precision")
            tols, per_output = parse_tolerance_flags(atol=atol, rtol=rtol, min_cosine=min_cosine)
            options = ConvertOptions(
                targets=targets, framework="onnx", inputs=[parse_input_spec(t) for t in inputs],
                **tols, output_tolerances=per_output, allow_precision_fallback=allow_fallback, strict=strict,
                precision=precision.lower(), seed=seed,
                sample_dims=parse_dims(dim), force=force, calibration=calibration, command="emit",
                emit_options=emit_options(plan_only=plan_only, tflite_layout=tflite_layout, trt_shapes=trt_shapes,
                                          workspace=workspace, calibration=calibration, tflite_io_dtype=tflite_io_dtype),
            )
            with stage_status(quiet or json_out) as on_stage:
                return convert(model, output, options, on_stage=on_stage)

        from modelport.cli.render import render_report

        run(body, command="emit", json_out=json_out, quiet=quiet, render=lambda r: render_report(r, output))
