"""TorchServe bundle: `model-store/<name>.mar`, `config.properties`, `requirements.txt`.

The `.mar` is the zip `torch-model-archiver` writes: `MAR-INF/MANIFEST.json` naming the
serialized model and the handler, with every extra file at the archive root. The handler
(`torchserve_handler.py`, copied in as `modelport_handler.py`) runs either the ONNX artifact through
onnxruntime or the emitted PyTorch code (`model.py` + `model.safetensors`) with torch, and applies
the contract's preprocessing and the chosen postprocessing; the contract itself travels in the
archive as `modelport.json`. Member names are checked while writing: no absolute paths, no `..`,
no backslashes.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path, PurePosixPath

from modelport.errors import BadInputError, UnsafeInputError
from modelport.onnxfile.onnx_io import load_onnx
from modelport.packaging import Bundle, PackageOptions
from modelport.packaging.bundle import Artifacts, served_name, unservable
from modelport.packaging.requests import named_request, write_json_request
from modelport.packaging.torchserve_pins import IMAGE_PYTHON, IMAGE_TORCH, ONNXRUNTIME_MAX_IR, ONNXRUNTIME_MAX_OPSET, pins

NAME = "torchserve"
DESCRIPTION = "TorchServe model archive (.mar) with a handler running the ONNX artifact or the emitted PyTorch code"
# --runtime name -> (artifact kind the handler runs, serialized file in the archive)
RUNTIMES = {"onnxruntime": ("onnx", "model.onnx"), "torch": ("pytorch", "model.safetensors")}
RUNTIME_ALIASES = {"onnx": "onnxruntime", "ort": "onnxruntime", "pytorch": "torch"}
HANDLER = "modelport_handler.py"
ARCHIVER_VERSION = "0.12.0"  # the manifest format written here is torch-model-archiver 0.12.0's


def safe_arcname(name: str) -> str:
    """Refuse member names that would land outside the folder TorchServe extracts into."""
    p = PurePosixPath(name)
    if not name or "\\" in name or p.is_absolute() or ".." in p.parts or name.startswith("/") or ":" in p.parts[0]:
        raise UnsafeInputError(f"refusing archive member name '{name}' (absolute, '..' or backslash)")
    return str(p)


def build_time() -> time.struct_time:
    """The time stamped into archives: `SOURCE_DATE_EPOCH` when set (the reproducible-builds
    convention), else the zip format's epoch, so that a rerun writes the same bytes."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    return time.gmtime(max(int(epoch), 315532800) if epoch.isdigit() else 315532800)


def write_mar(path: Path, members: dict[str, Path | bytes]) -> Path:
    """Write a .mar (zip) from {member name: file or bytes}; names are checked first. Members are
    written in the given order with a fixed time stamp and mode, so the same inputs give the same bytes."""
    names = {safe_arcname(n): v for n, v in members.items()}
    stamp = build_time()[:6]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, value in names.items():
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, value if isinstance(value, bytes) else Path(value).read_bytes())
    return path


def _postprocess(mode: str) -> str:
    mode = (mode or "none").strip().lower()
    if mode in ("none", "softmax"):
        return mode
    if mode.startswith("topk=") and mode[5:].isdigit() and int(mode[5:]) > 0:
        return mode
    raise BadInputError(f"bad --postprocess '{mode}': none, softmax or topk=K")


def choose_runtime(artifacts: Artifacts, requested: str | None) -> str:
    """The handler's runtime: the one asked for, else torch when the emitted PyTorch code is there, else onnxruntime."""
    if requested:
        key = RUNTIME_ALIASES.get(requested.strip().lower(), requested.strip().lower())
        if key not in RUNTIMES:
            raise BadInputError(f"bad --runtime '{requested}' for TorchServe: {', '.join(RUNTIMES)}")
        if not (key == "onnxruntime" and artifacts.has("ort")):
            artifacts.get(RUNTIMES[key][0], f"the TorchServe {key} handler")
        return key
    if artifacts.has("pytorch"):
        return "torch"
    if artifacts.has("onnx") or artifacts.has("ort"):
        return "onnxruntime"
    raise unservable(artifacts, "TorchServe", "ONNX or an ORT-format model (onnxruntime handler) or the emitted PyTorch code")


def pytorch_files(artifacts: Artifacts) -> dict[str, Path]:
    """model.py and model.safetensors of the emitted PyTorch code (both must be there)."""
    folder = artifacts.get("pytorch", "the TorchServe torch handler")
    folder = folder if folder.is_dir() else folder.parent
    files = {n: folder / n for n in ("model.py", "model.safetensors")}
    for n, p in files.items():
        if not p.is_file() or p.is_symlink():
            raise BadInputError(f"the PyTorch code artifact has no {n}", path=folder,
                                hint="convert again with --to pytorch")
    return files


def check_image_onnxruntime(path: Path) -> None:
    """Refuse an ONNX model the image's onnxruntime (the pinned one) cannot load: newer IR or opset."""

    model = load_onnx(path, weights=False)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if model.ir_version > ONNXRUNTIME_MAX_IR or opset > ONNXRUNTIME_MAX_OPSET:
        version = pins("onnxruntime")["onnxruntime"]
        raise BadInputError(f"the TorchServe image's onnxruntime {version} loads ONNX IR <= {ONNXRUNTIME_MAX_IR} and opset "
                            f"<= {ONNXRUNTIME_MAX_OPSET}; this model has IR {model.ir_version}, opset {opset}", path=path,
                            hint=f"convert with --opset {ONNXRUNTIME_MAX_OPSET}, or serve the PyTorch code (--runtime torch)")


def manifest(name: str, version: str, serialized: str = "model.onnx") -> dict:
    return {
        "createdOn": time.strftime("%d/%m/%Y %H:%M:%S", build_time()),
        "runtime": "python",
        "model": {"modelName": name, "serializedFile": serialized, "handler": HANDLER, "modelVersion": version,
                  "requirementsFile": "requirements.txt"},
        "archiverVersion": ARCHIVER_VERSION,
    }


def requirements(runtime: str = "onnxruntime", device: str = "cpu") -> str:
    """The handler's own needs, pinned (`==`) to versions that install on the server image's Python.

    The pins come from `torchserve_pins.HANDLER_PINS`, not from this machine: the image runs
    Python 3.9, on which this machine's numpy or onnxruntime may not exist. For the torch
    handler, torch itself is TorchServe's (its images ship it), named in a comment.
    """

    lines = [f"# for the handler on pytorch/torchserve:{ARCHIVER_VERSION} (Python {IMAGE_PYTHON})\n"]
    if runtime == "torch":
        lines.append(f"# torch=={IMAGE_TORCH} is TorchServe's own; install it beside a bare torchserve\n")
    lines += [f"{pkg}=={version}\n" for pkg, version in pins(runtime, device).items()]
    return "".join(lines)


INFERENCE_PORT, MANAGEMENT_PORT, METRICS_PORT = 8080, 8081, 8082
# TorchServe writes its keys into key_file.json in the folder it starts from; they last this many minutes
# (its default, 60, would lock clients out of a running server every hour)
TOKEN_EXPIRATION_MIN = 525600
KEY_FILE = "key_file.json"


def config_properties(*, workers: int, batch: int, delay_ms: int) -> str:
    """TorchServe's config: only inference listens beyond the host; management and metrics stay on loopback.

    Token authorisation stays on (TorchServe's default since 0.11): every call, /ping included,
    needs `Authorization: Bearer <inference key>` from key_file.json; registering models through
    the management API is off (`enable_model_api=false`) and reachable from the host only.
    """
    return "\n".join([
        f"inference_address=http://0.0.0.0:{INFERENCE_PORT}",
        f"management_address=http://127.0.0.1:{MANAGEMENT_PORT}",
        f"metrics_address=http://127.0.0.1:{METRICS_PORT}",
        "disable_token_authorization=false",
        f"token_expiration_min={TOKEN_EXPIRATION_MIN}",
        "enable_model_api=false",
        "install_py_dep_per_model=false",
        f"default_workers_per_model={workers}",
        f"# requests TorchServe may group per handler call: batch_size={batch}, max_batch_delay={delay_ms} ms",
        "",
    ])


def key_command(folder: str = ".") -> str:
    """A shell line that sets KEY to the inference key TorchServe wrote into `folder`/key_file.json."""
    path = KEY_FILE if folder == "." else f"{folder}/{KEY_FILE}"
    return f"KEY=$(python3 -c \"import json; print(json.load(open('{path}'))['inference']['key'])\")"


def package(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:
    import importlib.resources


    name = served_name(artifacts, options)
    version = str(options.version or 1)
    runtime = choose_runtime(artifacts, options.runtime)
    serialized = RUNTIMES[runtime][1]
    if runtime == "onnxruntime" and not artifacts.has("onnx"):
        serialized = "model.ort"  # onnxruntime loads the ORT format as it loads .onnx
    meta = {**artifacts.contract(), "serving": {
        "runtime": runtime, "model_file": serialized, "postprocess": _postprocess(options.postprocess),
        "preprocess": bool(options.preprocess), "precision": artifacts.precision if runtime == "onnxruntime" else "fp32",
    }}
    if runtime == "torch":
        meta["serving"]["code_file"] = "model.py"
    handler = importlib.resources.files("modelport.packaging").joinpath("torchserve_handler.py").read_bytes()
    members: dict[str, Path | bytes] = {
        "MAR-INF/MANIFEST.json": json.dumps(manifest(name, version, serialized), indent=2).encode(),
        HANDLER: handler,
        "modelport.json": json.dumps(meta, indent=2).encode(),
        "requirements.txt": requirements(runtime, options.device).encode(),
    }
    if serialized == "model.ort":
        members["model.ort"] = artifacts.get("ort", "the TorchServe onnxruntime handler")
    elif runtime == "onnxruntime":
        onnx_files = artifacts.onnx_files()
        check_image_onnxruntime(onnx_files[0])
        members["model.onnx"] = onnx_files[0]
        for extra in onnx_files[1:]:
            members[extra.relative_to(onnx_files[0].parent).as_posix()] = extra
    else:
        members.update(pytorch_files(artifacts))
    store = out_dir / "model-store"
    store.mkdir(parents=True, exist_ok=True)
    mar = write_mar(store / f"{name}.mar", members)
    files = [mar]
    props = out_dir / "config.properties"
    props.write_text(config_properties(workers=options.instances, batch=1, delay_ms=max(1, options.queue_delay_us // 1000)))
    reqs = out_dir / "requirements.txt"
    reqs.write_text(requirements(runtime, options.device))
    files += [props, reqs]
    has_pre = any(s.preprocess for s in artifacts.inputs) and options.preprocess

    def request(a):
        body = named_request(a)
        if has_pre:
            body["preprocessed"] = True  # the sample data are model inputs already
        return body

    sample = write_json_request(out_dir / f"{name}.request.json", artifacts, request)
    if sample:
        files.append(sample)
    readme = out_dir / "README.md"
    readme.write_text(_readme(name, artifacts, sample, meta["serving"]))
    files.append(readme)
    return Bundle(NAME, out_dir, files, {"model_name": name, "version": version, "mar": str(mar.relative_to(out_dir)),
                                         "handler": HANDLER, "runtime": runtime, "postprocess": meta["serving"]["postprocess"],
                                         "gpu": options.device == "gpu"})


def _readme(name: str, artifacts: Artifacts, sample: Path | None, serving: dict) -> str:
    body = f"-d @{sample.name}" if sample else "-d '{\"inputs\": {...}}'"
    what = ("the ONNX model in onnxruntime" if serving["runtime"] == "onnxruntime"
            else "the emitted PyTorch code (`model.py`, weights `model.safetensors`) with torch")
    ins = "\n".join(f"- `{s.name}`: {s.dtype} {s.shape}" + (f", preprocessing {s.preprocess}" if s.preprocess else "")
                    for s in artifacts.inputs)
    return f"""# TorchServe bundle: {name}

`model-store/{name}.mar` runs {what} through `{HANDLER}`
(postprocessing: {serving['postprocess']}). Install the handler's needs beside TorchServe
(`pip install -r requirements.txt`, Java 17), then:

```sh
torchserve --start --ncs --model-store model-store \\
  --ts-config config.properties --models {name}={name}.mar
{key_command()}     # written where torchserve started
curl -sf -H "Authorization: Bearer $KEY" localhost:{INFERENCE_PORT}/ping
curl -s -X POST localhost:{INFERENCE_PORT}/predictions/{name} -H "Authorization: Bearer $KEY" \\
  -H 'Content-Type: application/json' {body}
torchserve --stop
```

Only the inference API listens beyond this host (port {INFERENCE_PORT}); the management ({MANAGEMENT_PORT}) and
metrics ({METRICS_PORT}) APIs are bound to 127.0.0.1, and registering models through the management API is
off. Token authorisation is on: TorchServe writes `{KEY_FILE}` (mode 0600) into the folder it starts
from, with an inference key, a management key and an API key; every call, `/ping` included, needs
`Authorization: Bearer <inference key>`. Give clients the inference key only. The keys change at
every start and last {TOKEN_EXPIRATION_MIN} minutes (`token_expiration_min`); a new inference key:
`curl "localhost:{MANAGEMENT_PORT}/token?type=inference" -H "Authorization: Bearer <API key>"` on this host.

The body is `{{"inputs": {{NAME: nested list}}}}`; the handler applies each input's preprocessing
from the contract unless the body says `"preprocessed": true`. Inputs:
{ins}
"""
