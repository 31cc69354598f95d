"""`modelport emit MODEL.onnx --to TARGET -o OUT`: an ONNX file to deployment artifacts, each validated.

The ONNX model is the reference (onnxruntime runs it on generated or given inputs); every
artifact is checked against those outputs, as `convert` does for framework sources.
"""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import choice, run, split_list, stage_status
from modelport.errors import BadInputError
from modelport.registry import EMITTERS
from modelport.resolve.precisions import all_precisions


def register(app: typer.Typer) -> None:
    @app.command("emit")
    @flags.taking(flags.SAMPLES, flags.SAMPLE_SETS, flags.TOLERANCES, flags.PRECISION, flags.TARGET_OPTIONS, flags.WRITES, flags.RESULT, flags.LIMITS)
    def emit_cmd(
        model: str = typer.Argument(..., help="ONNX model file."),
        to: flags.Targets = ...,
        precision: flags.EmitPrecision = None,
        **shared,
    ):
        """Emit deployment artifacts (TFLite, TensorRT, ORT format) from an ONNX model, each validated."""
        output = shared["output"]

        def body():
            from modelport.orchestration import ConvertOptions, convert
            from modelport.resolve.specs import parse_input_spec

            if not output:
                raise BadInputError("no output folder", hint="pass -o OUT_DIR")
            options = ConvertOptions(
                targets=[choice(t, EMITTERS, "target") for t in split_list(to)], framework="onnx",
                inputs=[parse_input_spec(t) for t in shared["inputs"]], **flags.parity_kwargs(shared),
                precision=choice(precision, all_precisions(), "precision"), calibration=shared["calibration"],
                strict=shared["strict"], **flags.limit_kwargs(shared), allow_precision_fallback=shared["allow_fallback"], force=shared["force"],
                **flags.target_kwargs(shared),
            )
            with stage_status(shared["quiet"] or shared["json_out"]) as on_stage:
                return convert(model, output, options, command="emit", on_stage=on_stage)

        from modelport.cli.render import render_report

        run(body, command="emit", json_out=shared["json_out"], quiet=shared["quiet"], junit=shared["junit"], render=lambda r: render_report(r, output))
