"""`modelport convert`: SOURCE → targets, validated, with report.json (MMdnn spellings accepted)."""

from __future__ import annotations

from typing import Optional

import typer

from modelport.cli._common import run, stage_status
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
        source: Optional[str] = typer.Argument(None, help="Model file or folder, or zoo:NAME."),
        to: Optional[str] = typer.Option(None, "--to", "-df", "--dstFramework", help="Target(s), comma-separated (default onnx)."),
        output: Optional[str] = typer.Option(None, "-o", "--output-dir", "-om", "--outputModel", help="Output folder."),
        framework: Optional[str] = typer.Option(None, "--from", "-sf", "--srcFramework", help="Source framework (else sniffed from the file)."),
        network: Optional[str] = typer.Option(None, "-in", "--inputNetwork", help="MMdnn: the network file (or architecture)."),
        weights: Optional[str] = typer.Option(None, "-iw", "--inputWeight", help="MMdnn: the weights file."),
        inputs: list[str] = typer.Option([], "--input", "--inputs", "-i", help="NAME:SHAPE[:DTYPE], e.g. input:batch,3,224,224 (repeatable)."),
        input_shape: list[str] = typer.Option([], "--inputShape", help="MMdnn: a shape per input, in order, e.g. 1,3,224,224."),
        outputs: list[str] = typer.Option([], "--output", "--outputs", help="Output names, in order (comma-separated or repeated)."),
        arch: Optional[str] = typer.Option(None, "--arch", help="Architecture for a state dict: zoo:NAME or package.module:Class."),
        opset: Optional[int] = typer.Option(None, "--opset", help="Target ONNX opset."),
        atol: Optional[float] = typer.Option(None, "--atol", help="Absolute tolerance for parity."),
        rtol: Optional[float] = typer.Option(None, "--rtol", help="Relative tolerance for parity."),
        min_cosine: Optional[float] = typer.Option(None, "--min-cosine", help="Minimum cosine similarity per output."),
        layout: list[str] = typer.Option([], "--layout", help="Input layout, e.g. NCHW or image=NHWC."),
        mean: list[str] = typer.Option([], "--mean", help="Preprocessing mean, e.g. 0.485,0.456,0.406 or NAME=..."),
        std: list[str] = typer.Option([], "--std", help="Preprocessing std, e.g. 0.229,0.224,0.225 or NAME=..."),
        scale: list[str] = typer.Option([], "--scale", help="Preprocessing scale, e.g. 0.00392 or NAME=..."),
        channel_order: Optional[str] = typer.Option(None, "--channel-order", help="RGB or BGR."),
        dim: list[str] = typer.Option([], "--dim", help="Size of a symbolic dim in sample data, e.g. batch=4."),
        seed: int = typer.Option(0, "--seed", help="Seed of the sample inputs."),
        trust: bool = typer.Option(False, "--trust", help="Allow loading that runs code from the model file."),
        force: bool = typer.Option(False, "--force", help="Replace an existing output folder."),
        json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No tables or progress."),
    ):
        """Convert a model into one or more targets, validated against the source framework."""

        def body():
            from modelport.convert import ConvertOptions, convert
            from modelport.specs import apply_options, parse_dims, parse_input_spec

            src, arch_ = source_from_mmdnn(source, network, weights, arch)
            if not output:
                raise BadInputError("no output folder", hint="pass -o OUT_DIR")
            specs = apply_options(
                [parse_input_spec(t) for t in inputs], input_shapes=input_shape, layouts=layout,
                means=mean, stds=std, scales=scale, channel_order=channel_order,
            )
            targets = [t.strip().lower() for t in (to or "onnx").split(",") if t.strip()]
            out_names = [n.strip() for o in outputs for n in o.split(",") if n.strip()] or None
            options = ConvertOptions(
                targets=targets, framework=framework, inputs=specs, output_names=out_names, arch=arch_,
                trust=trust, opset=opset, atol=atol, rtol=rtol, min_cosine=min_cosine,
                sample_dims=parse_dims(dim), seed=seed, force=force,
            )
            with stage_status(quiet or json_out) as on_stage:
                return convert(src, output, options, on_stage=on_stage)

        from modelport.cli.render import render_report

        run(body, json_out=json_out, quiet=quiet, render=lambda r: render_report(r, output))
