"""Triton Inference Server model repository: `<name>/config.pbtxt` and `<name>/<version>/<model file>`.

The config is built as Triton's own `ModelConfig` protobuf message (from tritonclient) and
written with protobuf's text format, so it is schema-valid by construction; `parse_config`
reads one back through the same schema. Inputs and outputs, their Triton data types and dims,
and `max_batch_size` all come from the I/O contract: when dim 0 of every input and output is the
same symbolic axis, Triton batches on it and the dims leave it out; otherwise `max_batch_size`
is 0 and the dims are the full shapes, -1 for every dynamic dim.

pytorch_libtorch takes a TorchScript `model.pt`: a TorchScript artifact is copied, else the
emitted PyTorch code is traced (`torchscript.py`, parity-checked before it is written). TorchScript
keeps no tensor names, so its inputs and outputs follow the backend's `<name>__<index>` convention
(`INPUT__0`, `OUTPUT__0`, … in contract order). A TensorRT build plan without an engine
(`convert --to tensorrt --plan-only`) gives the config and `<version>/build/` (ONNX, trtexec.sh,
build_engine.py) whose scripts write `<version>/model.plan` on the serving GPU machine; Triton
ignores the non-numeric folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError
from modelport.packaging import Bundle, PackageOptions
from modelport.packaging.bundle import Artifacts, new_version, place_openvino_ir, served_name, unservable
from modelport.packaging.docker import image_for
from modelport.packaging.requests import v2_datatype, v2_request, write_json_request
from modelport.packaging.tfserving import export_saved_model
from modelport.packaging.torchscript import write_torchscript

NAME = "triton"
DESCRIPTION = "Triton model repository (config.pbtxt + versions), validated with Triton's config schema"

# --backend name -> (artifact kind, Triton platform, file or folder name in the version folder)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "onnx": ("onnx", "onnxruntime_onnx", "model.onnx"),
    "tensorrt": ("tensorrt", "tensorrt_plan", "model.plan"),
    "savedmodel": ("savedmodel", "tensorflow_savedmodel", "model.savedmodel"),
    "torchscript": ("torchscript", "pytorch_libtorch", "model.pt"),
    "openvino": ("openvino", "", "model.xml"),  # a backend, not a platform: config names `backend: "openvino"`
}
GPU_ONLY = {"tensorrt"}
BACKEND_ALIASES = {"pytorch": "torchscript", "libtorch": "torchscript", "trt": "tensorrt", "onnxruntime": "onnx"}
ACCEPTS = "ONNX, a TensorRT engine or build plan, a SavedModel, TorchScript, OpenVINO IR or the emitted PyTorch code"


def tensor_names(backend: str, artifacts: Artifacts) -> tuple[list[str], list[str]]:
    """Input and output names in the config: the contract's, or `INPUT__i`/`OUTPUT__i` for TorchScript."""
    if backend == "torchscript":
        return [f"INPUT__{i}" for i in range(len(artifacts.inputs))], [f"OUTPUT__{i}" for i in range(len(artifacts.outputs))]
    return [s.name for s in artifacts.inputs], [s.name for s in artifacts.outputs]


def _available(artifacts: Artifacts, backend: str) -> bool:
    kind = BACKENDS[backend][0]
    return artifacts.has(kind) or (backend == "torchscript" and artifacts.has("pytorch"))


def plan_only(artifacts: Artifacts) -> Path | None:
    """The TensorRT build-plan folder when the artifacts hold a plan but no engine."""
    p = artifacts.files.get("tensorrt")
    return p if p is not None and p.is_dir() and (p / "plan.json").is_file() else None


def _pb():

    return require("tritonclient.grpc.model_config_pb2", purpose="writing Triton model configs")


def choose_backend(artifacts: Artifacts, options: PackageOptions) -> str:
    if options.backend:
        backend = BACKEND_ALIASES.get(options.backend.lower(), options.backend.lower())
        if backend not in BACKENDS:
            raise BadInputError(f"unknown Triton backend '{options.backend}'; known: {', '.join(BACKENDS)}")
        return backend
    for name in BACKENDS:
        if _available(artifacts, name):
            return name
    raise unservable(artifacts, "Triton", ACCEPTS)


def _dims(shape: list, batched: bool) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in (shape[1:] if batched else shape)]


def build_config(artifacts: Artifacts, options: PackageOptions, backend: str, name: str):
    """The ModelConfig message for `artifacts` served by `backend`."""

    pb = _pb()
    if backend not in BACKENDS:
        raise BadInputError(f"unknown Triton backend '{backend}'; known: {', '.join(BACKENDS)}")
    _, platform, filename = BACKENDS[backend]
    names_in, names_out = tensor_names(backend, artifacts)
    gpu = options.device == "gpu" or backend in GPU_ONLY
    config = pb.ModelConfig(name=name, default_model_filename=filename,
                            **({"platform": platform} if platform else {"backend": backend}))
    if backend == "openvino":
        openvino_parameters(config, artifacts)
    batch_axis = artifacts.batch_axis() if options.max_batch_size > 0 else None
    config.max_batch_size = options.max_batch_size if batch_axis else 0
    if backend == "tensorrt" and batch_axis:
        _check_profile_batch(artifacts, options.max_batch_size)
    for specs, names, field in ((artifacts.inputs, names_in, config.input), (artifacts.outputs, names_out, config.output)):
        for s, tensor_name in zip(specs, names, strict=True):
            t = field.add(name=tensor_name, data_type=pb.DataType.Value("TYPE_" + v2_datatype(s.dtype).replace("BYTES", "STRING")))
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


def openvino_parameters(config, artifacts: Artifacts) -> None:
    """Triton's OpenVINO backend takes OpenVINO settings as parameters. Its only precision switch
    is `HINT_BF16`: a bf16 artifact sets it; for any other the backend leaves the device default,
    which on a BF16 CPU is bf16 too (the README says so; the OVMS bundle pins f32 explicitly)."""
    config.parameters["PERFORMANCE_HINT"].string_value = "LATENCY"
    if artifacts.entries.get("openvino", {}).get("inference_precision") == "bf16":
        config.parameters["HINT_BF16"].string_value = "YES"


def _check_profile_batch(artifacts: Artifacts, max_batch: int) -> None:
    """Triton may batch up to max_batch_size: the engine's optimisation profile must reach that far."""
    import json

    folder = plan_only(artifacts) or artifacts.source / "tensorrt"
    if not (folder / "plan.json").is_file():
        return
    profiles = json.loads((folder / "plan.json").read_text()).get("profiles") or []
    top = min((p["max"][0] for p in profiles if p.get("max")), default=None)
    if top is not None and max_batch > top:
        raise BadInputError(f"--max-batch {max_batch} exceeds the TensorRT profile's max batch {top}",
                            path=folder / "plan.json", hint=f"pass --max-batch {top} or less, or rebuild with larger --trt-shapes")


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



def _place_model(artifacts: Artifacts, backend: str, version_dir: Path, options: PackageOptions,
                 details: dict) -> list[Path]:
    kind, _, filename = BACKENDS[backend]
    version_dir.mkdir(parents=True)
    if backend == "torchscript" and not artifacts.has("torchscript"):

        details["torchscript"] = write_torchscript(artifacts, version_dir / filename, trust=options.trust)
        return [version_dir / filename]
    if backend == "tensorrt" and plan_only(artifacts):
        build = version_dir / "build"
        shutil.copytree(plan_only(artifacts), build, symlinks=False)
        details["engine"] = f"not built: run {build.relative_to(version_dir.parent.parent)}/trtexec.sh on the serving GPU"
        return [p for p in build.rglob("*") if p.is_file()]
    if backend == "openvino":
        return place_openvino_ir(artifacts, version_dir, "the Triton openvino backend")
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

    backend = choose_backend(artifacts, options)
    name = served_name(artifacts, options)
    model_dir = out_dir / name
    version, existing = new_version(model_dir, name, options.version)
    config = build_config(artifacts, options, backend, name)
    old_config = model_dir / "config.pbtxt"
    if existing and old_config.is_file():
        old = parse_config(old_config.read_text())
        if (old.platform or old.backend) and (old.platform, old.backend) != (config.platform, config.backend):
            raise BadInputError(f"the repository serves '{name}' with {old.platform or old.backend}; version {version} would need "
                                f"{config.platform or config.backend}", path=old_config)
    details: dict = {}
    files = _place_model(artifacts, backend, model_dir / str(version), options, details)
    text = config_text(config)
    parse_config(text)  # the round trip through Triton's schema is the check
    old_config.parent.mkdir(parents=True, exist_ok=True)
    old_config.write_text(text)
    files.append(old_config)
    names_in, _ = tensor_names(backend, artifacts)

    def request_fn(a):
        body = v2_request(a)
        for entry, tensor_name in zip(body["inputs"], names_in, strict=True):
            entry["name"] = tensor_name
        return body

    request = write_json_request(out_dir / f"{name}.request.json", artifacts, request_fn)
    if request:
        files.append(request)
    readme = out_dir / "README.md"
    readme.write_text(_readme(name, version, backend, config, request, artifacts, details))
    files.append(readme)
    return Bundle(NAME, out_dir, files, {"model_name": name, "version": version, "versions": [*existing, version],
                                         "platform": config.platform or config.backend, "max_batch_size": config.max_batch_size,
                                         "gpu": options.device == "gpu" or backend in GPU_ONLY, **details})


def _readme(name: str, version: int, backend: str, config, request: Path | None, artifacts: Artifacts,
            details: dict) -> str:

    gpu = any(g.kind == 1 for g in config.instance_group)  # KIND_GPU
    image = image_for("triton", gpu)
    gpus = "--gpus all " if gpu else ""
    body = f"-d @{request.name}" if request else "-d '{\"inputs\": [...]}'  # KServe v2 JSON, one entry per input"
    ins = "\n".join(f"- `{i.name}`: {_pb().DataType.Name(i.data_type)} dims {list(i.dims)}" for i in config.input)
    notes = ""
    if backend == "torchscript":
        pairs = [*zip(config.input, artifacts.inputs, strict=True), *zip(config.output, artifacts.outputs, strict=True)]
        notes += ("\nTorchScript keeps no tensor names: Triton's PyTorch backend takes them by position, so the\n"
                  "config names them `INPUT__i`/`OUTPUT__i`. Contract names:\n"
                  + "\n".join(f"- `{t.name}` is `{s.name}`" for t, s in pairs) + "\n")
    if backend == "openvino":
        bf16 = "HINT_BF16" in config.parameters
        notes += ("\nServed by Triton's OpenVINO backend (`backend: \"openvino\"`, `model.xml` + `model.bin`). "
                  + ("The artifact was validated at bf16\n(`HINT_BF16`).\n" if bf16 else
                     "Its only precision parameter is\n`HINT_BF16`: it cannot pin f32, and on a CPU with BF16 OpenVINO's "
                     "default is bf16. For f32 as validated,\nserve the OVMS bundle (`--for ovms`), which sets "
                     "INFERENCE_PRECISION_HINT.\n"))
    if "engine" in details:
        notes += (f"\nThe TensorRT engine is not built yet (the conversion wrote its build plan only). On the GPU\n"
                  f"machine that will serve it, with the Triton image's TensorRT version, build it first:\n\n"
                  f"```sh\nsh {name}/{version}/build/trtexec.sh        # or: python {name}/{version}/build/build_engine.py\n```\n\n"
                  f"It writes `{name}/{version}/model.plan`; Triton ignores the `build/` folder.\n")
    return f"""# Triton model repository: {name}

Version {version} of `{name}` ({config.platform or config.backend}); max_batch_size {config.max_batch_size}.

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
{notes}"""
