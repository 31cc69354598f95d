"""`modelport convert`: SOURCE → targets, validated, with report.json (MMdnn spellings accepted)."""

from __future__ import annotations

import typer

from modelport.cli._common import EMIT_PRECISIONS, choice, run, split_list, stage_status
from modelport.emitters import EMITTERS
from modelport.errors import BadInputError


def source_from_mmdnn(source: str | None, network: str | None, weights: str | None, arch: str | None):
    """MMdnn passes the model as -in (network) and/or -iw (weights). Returns (source, arch)."""
    if source:
        if network or weights:
            raise BadInputError("give the model either as SOURCE or with -in/-iw, not both")
        return source, arch
    if network and weights:
        # -in names the architecture (zoo:NAME or package.module:Class), -iw the weights file
        if ":" in network and not network.endswith((".py",)) and (network.startswith("zoo:") or "." in network.split(":")[0]):
            return weights, arch or network
        raise BadInputError("with both -in and -iw, -in must name the architecture (zoo:NAME or package.module:Class)")
    if network or weights:
        return network or weights, arch
    raise BadInputError("no source model given", hint="modelport convert SOURCE --to onnx -o OUT_DIR")


def register(app: typer.Typer) -> None:
    @app.command("convert")
    def convert_cmd(
        source: str | None = typer.Argument(None, help="Model file or folder, or zoo:NAME."),
        to: list[str] = typer.Option([], "--to", "-df", "--dstFramework", help=f"Target(s), comma-separated or repeated: {', '.join(EMITTERS)} (default onnx)."),
        output: str | None = typer.Option(None, "-o", "--output-dir", "-om", "--outputModel", help="Output folder."),
        framework: str | None = typer.Option(None, "--from", "-sf", "--srcFramework", help="Source framework (else sniffed from the file)."),
        network: str | None = typer.Option(None, "-in", "--inputNetwork", help="MMdnn: the network file (or architecture)."),
        weights: str | None = typer.Option(None, "-iw", "--inputWeight", help="MMdnn: the weights file."),
        inputs: list[str] = typer.Option([], "--input", "--inputs", "-i", help="NAME:SHAPE[:DTYPE], e.g. input:batch,3,224,224 (repeatable)."),
        input_shape: list[str] = typer.Option([], "--inputShape", help="MMdnn: a shape per input, in order, e.g. 1,3,224,224."),
        outputs: list[str] = typer.Option([], "--output", "--outputs", help="Output names, in order (comma-separated or repeated)."),
        arch: str | None = typer.Option(None, "--arch", help="Architecture for a state dict: zoo:NAME or package.module:Class."),
        opset: int | None = typer.Option(None, "--opset", help="Target ONNX opset."),
        atol: list[str] = typer.Option([], "--atol", help="Absolute tolerance (scaled by each output's magnitude), e.g. 1e-4; OUTPUT=VALUE for one output (repeatable, comma-separated)."),
        rtol: list[str] = typer.Option([], "--rtol", help="Relative tolerance, e.g. 1e-3; OUTPUT=VALUE for one output (repeatable, comma-separated)."),
        min_cosine: list[str] = typer.Option([], "--min-cosine", help="Minimum cosine similarity, e.g. 0.999; OUTPUT=VALUE for one output (repeatable, comma-separated)."),
        layout: list[str] = typer.Option([], "--layout", help="Input layout, e.g. NCHW or image=NHWC."),
        mean: list[str] = typer.Option([], "--mean", help="Preprocessing mean, e.g. 0.485,0.456,0.406 or NAME=..."),
        std: list[str] = typer.Option([], "--std", help="Preprocessing std, e.g. 0.229,0.224,0.225 or NAME=..."),
        scale: list[str] = typer.Option([], "--scale", help="Preprocessing scale, e.g. 0.00392 or NAME=..."),
        channel_order: str | None = typer.Option(None, "--channel-order", help="RGB or BGR."),
        dim: list[str] = typer.Option([], "--dim", help="Size of a symbolic dim in sample data, e.g. batch=4."),
        seed: int = typer.Option(0, "--seed", help="Seed of the sample inputs."),
        trust: bool = typer.Option(False, "--trust", help="Allow loading that runs code from the model file."),
        signature: str | None = typer.Option(None, "--signature", help="SavedModel/TFLite signature to convert (default serving_default)."),
        input_names: list[str] = typer.Option([], "--input-names", help="New names for the model's inputs, in order, comma-separated (TF sources)."),
        optimize: str | None = typer.Option(None, "--optimize", "-O", help="Optimisation level: none, basic, extended, all or auto."),
        precision: str = typer.Option("fp32", "--precision", help="fp32, fp16, int8 (TensorRT also best)."),
        calibration: str | None = typer.Option(None, "--calibration", help="INT8 calibration data: .npz of named inputs or a folder of images."),
        accuracy_budget: str | None = typer.Option(None, "--accuracy-budget", help="e.g. cosine>=0.999 or max_abs<=0.01 (precision passes and auto)."),
        strict: bool = typer.Option(False, "--strict", help="An optimisation pass that breaks parity, or a source output that ignores its input, fails the run (exit 4)."),
        allow_fallback: bool = typer.Option(False, "--allow-precision-fallback", help="Accept an FP32 artifact when --precision cannot be delivered within tolerance (else exit 4)."),
        plan_only: bool = typer.Option(False, "--plan-only", help="TensorRT: check and write the build plan (tensorrt/) without building an engine."),
        tflite_layout: str = typer.Option("source", "--tflite-layout", help="TFLite I/O layout: source (the contract's) or nhwc (channels-last inputs and outputs)."),
        tflite_io_dtype: str = typer.Option("float32", "--tflite-io-dtype", help="Full-integer TFLite (--precision int8 --calibration) I/O type: float32, int8 or uint8."),
        trt_shapes: list[str] = typer.Option([], "--trt-shapes", help="TensorRT profile NAME:MIN:OPT:MAX, e.g. x:1x3x224x224:8x3x224x224:32x3x224x224 (repeatable)."),
        workspace: int | None = typer.Option(None, "--workspace", help="TensorRT builder workspace limit in MiB (default 4096)."),
        package: list[str] = typer.Option([], "--package", help="Also package for serving systems, e.g. triton,torchserve (OUT/packages/<system>/)."),
        force: bool = typer.Option(False, "--force", help="Replace an existing output folder."),
        json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No tables or progress."),
    ):
        """Convert a model into one or more targets, validated against the source framework."""

        def body():
            from modelport.orchestration import ConvertOptions, convert
            from modelport.specs import apply_options, parse_dims, parse_input_spec
            from modelport.validation import parse_tolerance_flags

            src, arch_ = source_from_mmdnn(source, network, weights, arch)
            if not output:
                raise BadInputError("no output folder", hint="pass -o OUT_DIR")
            specs = apply_options(
                [parse_input_spec(t) for t in inputs], input_shapes=input_shape, layouts=layout,
                means=mean, stds=std, scales=scale, channel_order=channel_order,
            )
            from modelport.optimize import LEVELS
            from modelport.parsers import PARSERS

            targets = [choice(t, EMITTERS, "target") for t in split_list(to)] or ["onnx"]
            out_names = split_list(outputs) or None
            choice(framework, PARSERS, "source framework")
            choice(optimize, [*LEVELS, "auto"], "optimisation level")
            choice(precision, EMIT_PRECISIONS, "precision")
            tols, per_output = parse_tolerance_flags(atol=atol, rtol=rtol, min_cosine=min_cosine)
            options = ConvertOptions(
                targets=targets, framework=framework, inputs=specs, output_names=out_names, arch=arch_,
                trust=trust, opset=opset, **tols, output_tolerances=per_output,
                sample_dims=parse_dims(dim), seed=seed, force=force,
                optimize=optimize, precision=precision.lower(), calibration=calibration,
                accuracy_budget=accuracy_budget, strict=strict, allow_precision_fallback=allow_fallback,
            )
            if signature:
                options.source_options["signature"] = signature
            if package:
                from modelport.serving import PACKAGERS

                options.packages = [choice(p, PACKAGERS, "serving system") for p in split_list(package)]
            if input_names:
                options.source_options["input_names"] = split_list(input_names)
            from modelport.cli.emit import emit_options

            options.emit_options.update(emit_options(plan_only=plan_only, tflite_layout=tflite_layout,
                                                     trt_shapes=trt_shapes, workspace=workspace, calibration=calibration,
                                                     tflite_io_dtype=tflite_io_dtype))
            with stage_status(quiet or json_out) as on_stage:
                return convert(src, output, options, on_stage=on_stage)

        from modelport.cli.render import render_report

        run(body, command="convert", json_out=json_out, quiet=quiet, render=lambda r: render_report(r, output))
