"""Triton Inference Server model repository: `<name>/config.pbtxt` and `<name>/<version>/<model file>`.

The config is built as Triton's own `ModelConfig` protobuf message (from tritonclient) and
written with protobuf's text format, so it is schema-valid by construction; `parse_config`
reads one back through the same schema. Inputs and outputs, their Triton data types and dims,
and `max_batch_size` all come from the I/O contract: when dim 0 of every input and output is the
same symbolic axis, Triton batches on it and the dims leave it out; otherwise `max_batch_size`
is 0 and the dims are the full shapes, -1 for every dynamic dim.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from modelport.errors import BadInputError
from modelport.serving import Bundle, PackageOptions
from modelport.serving.bundle import Artifacts

NAME = "triton"
DESCRIPTION = "Triton model repository (config.pbtxt + versions), validated with Triton's config schema"

# --backend name -> (artifact kind, Triton platform, file or folder name in the version folder)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "onnx": ("onnx", "onnxruntime_onnx", "model.onnx"),
    "tensorrt": ("tensorrt", "tensorrt_plan", "model.plan"),
    "savedmodel": ("savedmodel", "tensorflow_savedmodel", "model.savedmodel"),
    "torchscript": ("torchscript", "pytorch_libtorch", "model.pt"),
}
GPU_ONLY = {"tensorrt"}


def _pb():
    from modelport.deps import require

    return require("tritonclient.grpc.model_config_pb2", purpose="writing Triton model configs")


def choose_backend(artifacts: Artifacts, options: PackageOptions) -> str:
    if options.backend:
        if options.backend not in BACKENDS:
            raise BadInputError(f"unknown Triton backend '{options.backend}'; known: {', '.join(BACKENDS)}")
        return options.backend
    for name, (kind, _, _) in BACKENDS.items():
        if artifacts.has(kind):
            return name
    raise BadInputError("no artifact Triton can serve", path=artifacts.source,
                        hint="convert with --to onnx (or tensorrt)")


def _dims(shape: list, batched: bool) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in (shape[1:] if batched else shape)]


def build_config(artifacts: Artifacts, options: PackageOptions, backend: str, name: str):
    """The ModelConfig message for `artifacts` served by `backend`."""
    from modelport.serving.requests import v2_datatype

    pb = _pb()
    if backend not in BACKENDS:
        raise BadInputError(f"unknown Triton backend '{backend}'; known: {', '.join(BACKENDS)}")
    _, platform, filename = BACKENDS[backend]
    gpu = options.device == "gpu" or backend in GPU_ONLY
    config = pb.ModelConfig(name=name, platform=platform, default_model_filename=filename)
    batch_axis = artifacts.batch_axis() if options.max_batch_size > 0 else None
    config.max_batch_size = options.max_batch_size if batch_axis else 0
    for specs, field in ((artifacts.inputs, config.input), (artifacts.outputs, config.output)):
        for s in specs:
            t = field.add(name=s.name, data_type=pb.DataType.Value("TYPE_" + v2_datatype(s.dtype).replace("BYTES", "STRING")))
            dims = _dims(s.shape, bool(batch_axis))
            if dims:
                t.dims.extend(dims)
            else:  # a scalar (or a batched vector): Triton needs a dim, reshaped away
                t.dims.append(1)
                t.reshape.SetInParent()
            if field is config.input and s.layout in ("NCHW", "NHWC") and len(s.shape) == 4:
                t.format = pb.ModelInput.Format.Value("FORMAT_" + s.layout)
    if batch_axis and options.dynamic_batching:
        preferred = options.preferred_batch_sizes or sorted({b for b in (options.max_batch_size // 2, options.max_batch_size) if b > 1})
        bad = [b for b in preferred if b < 1 or b > options.max_batch_size]
        if bad:
            raise BadInputError(f"preferred batch sizes {bad} are outside 1..{options.max_batch_size} (--max-batch)")
        config.dynamic_batching.preferred_batch_size.extend(preferred)
        config.dynamic_batching.max_queue_delay_microseconds = options.queue_delay_us
    group = config.instance_group.add(count=options.instances, kind=pb.ModelInstanceGroup.Kind.Value("KIND_GPU" if gpu else "KIND_CPU"))
    if gpu:
        group.gpus.append(0)
    if options.trt_acceleration:
        if backend != "onnx" or not gpu:
            raise BadInputError("--trt-accel applies to the ONNX backend on GPU only (add --device gpu)")
        acc = config.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
        acc.parameters["precision_mode"] = options.trt_precision.upper()
        acc.parameters["max_workspace_size_bytes"] = str(1 << 30)
    return config


def config_text(config) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(config)


def parse_config(text: str):
    """Parse config.pbtxt text with Triton's schema; unknown fields or bad values raise BadInputError."""
    from google.protobuf import text_format

    pb = _pb()
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as e:
        raise BadInputError(f"not a valid Triton model config: {e}") from None


def _existing_versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()) if model_dir.is_dir() else []


def _place_model(artifacts: Artifacts, backend: str, version_dir: Path) -> list[Path]:
    kind, _, filename = BACKENDS[backend]
    version_dir.mkdir(parents=True)
    if backend == "onnx":
        src_files = artifacts.onnx_files()
        main = version_dir / filename
        shutil.copyfile(src_files[0], main)
        out = [main]
        for extra in src_files[1:]:  # external data keeps the name the model refers to
            dst = version_dir / extra.relative_to(src_files[0].parent)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(extra, dst)
            out.append(dst)
        return out
    if backend == "savedmodel" and not artifacts.has("savedmodel"):
        from modelport.serving.tfserving import export_saved_model

        export_saved_model(artifacts, version_dir / filename)
        return [p for p in (version_dir / filename).rglob("*") if p.is_file()]
    src = artifacts.get(kind, f"the Triton {backend} backend")
    dst = version_dir / filename
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=False)
        return [p for p in dst.rglob("*") if p.is_file()]
    shutil.copyfile(src, dst)
    return [dst]


def package(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:
    """Write (or add a version to) a model repository rooted at `out_dir`."""
    from modelport.serving.requests import v2_request, write_json_request

    backend = choose_backend(artifacts, options)
    name = options.model_name or artifacts.name
    model_dir = out_dir / name
    existing = _existing_versions(model_dir)
    version = options.version or ((existing[-1] + 1) if existing else 1)
    if (model_dir / str(version)).exists():
        raise BadInputError(f"version {version} of '{name}' already exists in the repository", path=model_dir / str(version),
                            hint="pick another --version, or --force without --add-version to replace the repository")
    config = build_config(artifacts, options, backend, name)
    old_config = model_dir / "config.pbtxt"
    if existing and old_config.is_file():
        old = parse_config(old_config.read_text())
        if old.platform and old.platform != config.platform:
            raise BadInputError(f"the repository serves '{name}' with {old.platform}; version {version} would need {config.platform}",
                                path=old_config)
    files = _place_model(artifacts, backend, model_dir / str(version))
    text = config_text(config)
    parse_config(text)  # the round trip through Triton's schema is the check
    old_config.parent.mkdir(parents=True, exist_ok=True)
    old_config.write_text(text)
    files.append(old_config)
    request = write_json_request(out_dir / f"{name}.request.json", artifacts, v2_request)
    if request:
        files.append(request)
    readme = out_dir / "README.md"
    readme.write_text(_readme(name, version, backend, config, request))
    files.append(readme)
    return Bundle(NAME, out_dir, files, {"model_name": name, "version": version, "versions": [*existing, version],
                                         "platform": config.platform, "max_batch_size": config.max_batch_size,
                                         "gpu": options.device == "gpu" or backend in GPU_ONLY})


def _readme(name: str, version: int, backend: str, config, request: Path | None) -> str:
    from modelport.serving.docker import image_for

    gpu = any(g.kind == 1 for g in config.instance_group)  # KIND_GPU
    image = image_for("triton", gpu)
    gpus = "--gpus all " if gpu else ""
    body = f"-d @{request.name}" if request else "-d '{\"inputs\": [...]}'  # KServe v2 JSON, one entry per input"
    ins = "\n".join(f"- `{i.name}`: {_pb().DataType.Name(i.data_type)} dims {list(i.dims)}" for i in config.input)
    return f"""# Triton model repository: {name}

Version {version} of `{name}` ({config.platform}); max_batch_size {config.max_batch_size}.

Start the server on this folder:

```sh
docker run --rm {gpus}-p 8000:8000 -p 8001:8001 -p 8002:8002 -v "$PWD":/models {image} \\
  tritonserver --model-repository=/models
curl -sf localhost:8000/v2/health/ready && echo ready
```

Call it (KServe v2 protocol over HTTP):

```sh
curl -s -X POST localhost:8000/v2/models/{name}/infer -H 'Content-Type: application/json' {body}
```

Inputs (Triton data types; the batch axis is left out of the dims when max_batch_size > 0):
{ins}
"""
