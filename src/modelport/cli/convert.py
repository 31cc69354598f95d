"""`modelport convert`: SOURCE → targets, validated, with report.json (MMdnn spellings accepted)."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import choice, run, split_list, stage_status
from modelport.errors import BadInputError
from modelport.registry import EMITTERS, PACKAGERS
from modelport.resolve.precisions import all_precisions

ConvertTargets = flags.aliased(flags.Targets, "-df", "--dstFramework")
ConvertOutputDir = flags.aliased(flags.OutputDir, "-om", "--outputModel")
ConvertInputs = flags.aliased(flags.Inputs, "--inputs")


def takes_weights(network: str) -> bool:
    """Whether MMdnn's -in names a network file whose weights -iw gives (parsers.NETWORK_FILES)."""
    from pathlib import PurePath

    from modelport.parsers import NETWORK_FILES

    return PurePath(network).suffix.lower() in NETWORK_FILES


def network_suffixes() -> str:
    """The network files -iw goes with, as messages list them: `.prototxt (caffe)`, …"""
    from modelport.parsers import NETWORK_FILES

    return ", ".join(f"{suffix} ({name})" for suffix, name in NETWORK_FILES.items())


def source_from_mmdnn(source: str | None, network: str | None, weights: str | None, arch: str | None):
    """MMdnn passes the model as -in (network) and/or -iw (weights). Returns (source, arch); for a
    network file (a Keras architecture JSON, a Caffe prototxt, a Darknet cfg, a Paddle .pdmodel) the
    source is that file and the weights travel as TFSourceOptions.weights."""
    if source:
        if network or (weights and not takes_weights(source)):
            raise BadInputError("give the model either as SOURCE or with -in/-iw, not both",
                                hint=f"-iw goes with SOURCE only for a network file ({network_suffixes()})")
        return source, arch
    if network and weights:
        if takes_weights(network):  # a network file and its weights (the caller passes -iw on)
            return network, arch
        # -in names the architecture (zoo:NAME or package.module:Class), -iw the weights file
        if ":" in network and not network.endswith((".py",)) and (network.startswith("zoo:") or "." in network.split(":")[0]):
            return weights, arch or network
        raise BadInputError("with both -in and -iw, -in must name the architecture (zoo:NAME, package.module:Class) or a "
                            f"network file ({network_suffixes()})")
    if network or weights:
        return network or weights, arch
    raise BadInputError("no source model given", hint="modelport convert SOURCE --to onnx -o OUT_DIR")


def register(app: typer.Typer) -> None:
    @app.command("convert")
    @flags.taking(flags.SAMPLES, flags.SAMPLE_SETS, flags.TOLERANCES, flags.PREPROCESSING, flags.PRECISION, flags.TARGET_OPTIONS, flags.WRITES,
                  flags.RESULT, flags.LIMITS)
    def convert_cmd(
        source: str | None = typer.Argument(None, help="Model file or folder, or zoo:NAME."),
        to: ConvertTargets = [],
        output: ConvertOutputDir = None,
        framework: str | None = typer.Option(None, "--from", "-sf", "--srcFramework", help="Source framework (else sniffed from the file)."),
        network: str | None = typer.Option(None, "-in", "--inputNetwork", help="MMdnn: the network file (or architecture)."),
        weights: str | None = typer.Option(None, "-iw", "--inputWeight", help="MMdnn: the weights file."),
        inputs: ConvertInputs = [],
        input_shape: list[str] = typer.Option([], "--inputShape", help="MMdnn: a shape per input, in order, e.g. 1,3,224,224."),
        outputs: list[str] = typer.Option([], "--output", "--outputs", help="Output names, in order (comma-separated or repeated)."),
        arch: str | None = typer.Option(None, "--arch", help="Architecture for a state dict: zoo:NAME or package.module:Class."),
        arch_args: list[str] = typer.Option([], "--arch-args", help="Keyword arguments for the --arch constructor, e.g. "
                                            "model=tiny,dim=256 (values read as JSON scalars, else text; repeatable)."),
        state_dict_key: str | None = typer.Option(None, "--state-dict-key", help="The checkpoint entry holding the weights, "
                                                  "e.g. model_state or checkpoint.model (default: the one whose keys fit --arch)."),
        opset: int | None = typer.Option(None, "--opset", help="Target ONNX opset."),
        trust: flags.Trust = False,
        task: flags.Task = None,
        signature: str | None = typer.Option(None, "--signature", help="SavedModel/TFLite signature to convert (default serving_default)."),
        input_names: list[str] = typer.Option([], "--input-names", help="New names for the model's inputs, in order, comma-separated (TF sources)."),
        optimize: str | None = typer.Option(None, "--optimize", "-O", help="Optimisation level: none, basic, extended, all or auto."),
        precision: flags.EmitPrecision = None,
        accuracy_budget: flags.AccuracyBudget = None,
        runtimes: str | None = typer.Option(None, "--runtimes", help="--optimize auto: CPU runtimes whose candidates compete, "
                                            "e.g. onnxruntime,openvino (default: each installed one that writes a --to target)."),
        package: list[str] = typer.Option([], "--package", help="Also package for serving systems, e.g. triton,torchserve (OUT/packages/<system>/)."),
        keep_failed: flags.KeepFailed = False,
        new_tokens: int = typer.Option(32, "--new-tokens", help="text-generation: tokens generated per prompt when validating."),
        block_size: int = typer.Option(32, "--block-size", help="text-generation --precision int4/int8: input channels per scale."),
        asymmetric: bool = typer.Option(False, "--asymmetric", help="text-generation --precision int4/int8: zero points per block."),
        reference: str = typer.Option("auto", "--reference", help="text-generation: transformers (the fp32 model in memory), "
                                      "streamed (a layer at a time from the safetensors) or auto (streamed from 1 B parameters or when the fp32 model does not fit)."),
        **shared,
    ):
        """Convert a model into one or more targets, validated against the source framework."""

        def body():
            from modelport.optimize.pipeline import OptimizeOptions
            from modelport.orchestration import ConvertOptions, convert
            from modelport.orchestration.text_generation_options import TextGenerationOptions
            from modelport.parsers import PARSERS
            from modelport.parsers.tf_common import TFSourceOptions
            from modelport.resolve.specs import apply_options, parse_input_spec

            src, arch_ = source_from_mmdnn(source, network, weights, arch)
            if not output:
                raise BadInputError("no output folder", hint="pass -o OUT_DIR")
            specs = apply_options([parse_input_spec(t) for t in inputs], input_shapes=input_shape, **flags.preprocessing_kwargs(shared))
            options = ConvertOptions(
                task=task, accuracy_budget=accuracy_budget,
                text_generation=TextGenerationOptions(new_tokens=new_tokens, block_size=block_size, symmetric=not asymmetric,
                                                      reference=reference),
                targets=[choice(t, EMITTERS, "target") for t in split_list(to)] or ["onnx"],
                framework=choice(framework, PARSERS, "source framework"), inputs=specs, output_names=split_list(outputs) or None,
                arch=arch_, arch_args=arch_args, state_dict_key=state_dict_key, trust=trust, opset=opset, force=shared["force"], keep_failed=keep_failed,
                **flags.parity_kwargs(shared),
                optimize=OptimizeOptions(level=optimize, runtimes=runtimes),
                precision=choice(precision, all_precisions(), "precision"), calibration=shared["calibration"],
                strict=shared["strict"], **flags.limit_kwargs(shared), allow_precision_fallback=shared["allow_fallback"],
                tensorflow=TFSourceOptions(signature=signature, input_names=split_list(input_names),
                                           weights=weights if takes_weights(network or source or "") else None),
                **flags.target_kwargs(shared),
                packages=[choice(p, PACKAGERS, "serving system") for p in split_list(package)],
            )
            with stage_status(shared["quiet"] or shared["json_out"]) as on_stage:
                return convert(src, output, options, on_stage=on_stage)

        from modelport.cli.render import render_report

        def render(report: dict) -> None:
            if report.get("optimize"):  # --optimize auto: the candidates it chose from, per runtime
                from modelport.cli._common import console
                from modelport.cli.optimize import auto_table

                console.print(auto_table(report["optimize"]))
            decoder_auto = next((s for s in report.get("stages", []) if s["name"] == "optimize:auto" and s.get("variants")), None)
            if decoder_auto and decoder_auto.get("chosen"):  # text generation's --optimize auto
                from modelport.cli._common import console
                from modelport.cli.optimize import decoder_auto_table

                console.print(decoder_auto_table(decoder_auto))
            render_report(report, output)

        run(body, command="convert", json_out=shared["json_out"], quiet=shared["quiet"], junit=shared["junit"], render=render)
