"""The source of a conversion: what it is (a path, `zoo:NAME` or a Python object) and how its parser
is asked to read it (`SourceSpec`), the paths no output may overwrite, the user's own sample
inputs, and what the report says about it once parsed."""

from __future__ import annotations

from pathlib import Path

from modelport.errors import BadInputError, ModelportError
from modelport.ir import IRModel
from modelport.onnxfile.onnx_io import external_files
from modelport.parsers import COMPANIONS, SourceSpec, huggingface
from modelport.parsers.contract import merge_specs
from modelport.parsers.pytorch_export import ExportFailedError
from modelport.reference.samples import load_data, parse_values
from modelport.run.file_checks import check_model_file, companion_file, sha256_of
from modelport.validation.report import Findings


def source_inputs(source, options=None) -> list[Path]:
    """The input paths an output must not overwrite (model file, its folder's data files, calibration data)."""
    paths = [Path(options.calibration)] if options and options.calibration else []
    paths += [Path(options.data)] if options and options.data else []
    paths += [Path(options.tensorflow.weights)] if options and options.tensorflow.weights else []
    if not isinstance(source, (str, Path)) or str(source).startswith("zoo:"):
        return paths
    p = Path(source)
    paths.append(p)

    if p.suffix.lower() in COMPANIONS and p.is_file():  # a network's weights beside it (or the network beside its weights)

        try:
            paths.append(companion_file(p, COMPANIONS[p.suffix.lower()], what="companion"))
        except ModelportError:
            pass  # none, or several: the parser says so
    if p.suffix.lower() == ".onnx" and p.is_file():

        try:
            paths += external_files(p)
        except ModelportError:
            pass  # reported properly when the parser loads the file
    return paths


def resolve_source(source, options):
    """(source object or path, SourceSpec, zoo tolerance) for a path, 'zoo:NAME' or a Python object."""

    zoo_tol = None
    if isinstance(source, str) and source.startswith("zoo:"):
        from modelport import zoo
        spec = zoo.source_spec(source[4:])
        zoo_tol = zoo.get(source[4:]).tolerance
        if options.inputs:

            spec.inputs = merge_specs(spec.inputs, options.inputs)
        spec.sample_dims.update(options.sample_dims)
    elif isinstance(source, (str, Path)):
        path = check_model_file(source)
        spec = SourceSpec(path=path, framework=options.framework, inputs=list(options.inputs),
                          sample_dims=dict(options.sample_dims))
        if options.arch and options.arch.startswith("zoo:"):
            from modelport import zoo
            zspec = zoo.source_spec(options.arch[4:])
            spec.sample_dims = {**zspec.sample_dims, **spec.sample_dims}
            zoo_tol = zoo.get(options.arch[4:]).tolerance
        source = path
    else:
        spec = SourceSpec(framework=options.framework, inputs=list(options.inputs), sample_dims=dict(options.sample_dims))
    spec.output_names = options.output_names or spec.output_names
    spec.arch = options.arch
    spec.arch_args = dict(options.arch_args)
    spec.state_dict_key = options.state_dict_key
    spec.trust = options.trust
    spec.opset = options.opset
    spec.seed = options.seed
    spec.sampling = dict(options.sampling)
    spec.given = pinned_inputs(options.data, options.values)
    spec.options.update(options.tensorflow.spec_options())
    if options.task:

        if not (isinstance(source, Path) and huggingface.sniff(source)):
            raise BadInputError("--task applies to Hugging Face model folders (config.json + *.safetensors)",
                                path=source if isinstance(source, Path) else None)
        spec.options["task"] = options.task
    return source, spec, zoo_tol


def pinned_inputs(data, values: list[str]) -> dict:
    """The user's sample inputs: the arrays of the `data` .npz, then each `--value NAME=V` (which wins)."""

    texts = [f"{k}={v}" for k, v in values.items()] if isinstance(values, dict) else list(values)
    return {**(load_data(data) if data else {}), **parse_values(texts)}


# what the parser recorded about how it read the source that the report's `source` repeats
SOURCE_DETAILS = ("arch", "arch_args", "state_dict_key", "state_dict_prefix_removed", "state_dict_prefix_added",
                  "state_dict_keys_left_out", "source_precision")


def describe_source(source, ir: IRModel) -> dict:

    info = {"path": ir.provenance.get("path"), "framework": ir.provenance.get("framework"),
            "format": ir.provenance.get("format")}
    info.update({k: ir.provenance[k] for k in SOURCE_DETAILS if ir.provenance.get(k) is not None})
    if isinstance(source, Path) and source.is_file():
        info.update(size=source.stat().st_size, sha256=sha256_of(source))
    return info


def parse_noting_attempts(parse, src, spec, parsed, found: Findings):
    """Parse; the export routes a PyTorch parse tried go in the parse stage row (`attempts`), and
    those that failed before one worked become warnings."""

    try:
        ir = parse(src, spec)
    except ExportFailedError as e:
        parsed.note(attempts=[a.to_dict() for a in e.attempts])
        raise
    if ir.provenance.get("saved_on"):
        found.warn(f"the file was saved on {', '.join(ir.provenance['saved_on'])}: read and converted on the CPU")
    for text in ir.provenance.get("warnings") or []:  # what the parser chose for the user (a checkpoint entry, sample sizes)
        found.warn(text)
    attempts = ir.provenance.get("export_attempts")
    if attempts:
        parsed.note(attempts=attempts)
        for a in attempts:
            if not a["ok"]:
                found.warn(f"export route {a['route']} failed: {a['reason']}")
        if ir.provenance.get("fixed_dims"):
            found.warn(f"export route {attempts[-1]['route']} fixed dynamic dims to their sample sizes: {ir.provenance['fixed_dims']}")
    return ir
