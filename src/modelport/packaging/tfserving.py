"""TF Serving bundle: `<name>/<version>/saved_model.pb` + `variables/`, and `models.config`.

A SavedModel artifact (e.g. from a Keras `model.export()`) is copied as it is. From ONNX, the
model goes through onnx2tf (`emitters/tf_model.py`, as the TFLite emitter's does) and is saved
behind a `serving_default` signature whose inputs and outputs have the contract's names, dtypes,
dynamic dims and layouts; channel-first tensors stay channel-first. The exported SavedModel is loaded back and its signature run on the contract's
sample inputs, checked for parity against the ONNX artifact in onnxruntime: a breach is exit 4.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from modelport.deps import require
from modelport.emitters.tf_model import build, save_contract_model
from modelport.errors import BadInputError
from modelport.ir import IRModel, Reference
from modelport.onnxfile.onnx_io import load_onnx
from modelport.packaging import Bundle, PackageOptions
from modelport.packaging.bundle import Artifacts, served_name, unservable
from modelport.packaging.docker import image_for
from modelport.packaging.requests import named_request, write_json_request
from modelport.run.quiet_call import captured_output
from modelport.runtimes.savedmodel import SIGNATURE, run_signature, signature_specs

NAME = "tfserving"
DESCRIPTION = "TF Serving SavedModel repository (<name>/<version>/) + models.config, parity-checked"


def _tf():

    return require("tensorflow", purpose="TF Serving bundles")


def export_saved_model(artifacts: Artifacts, dest: Path) -> Path:
    """Write a SavedModel for the contract at `dest` (copied, or converted from ONNX with onnx2tf)."""
    from modelport.validation import compare, tolerance_for

    if artifacts.has("savedmodel"):
        shutil.copytree(artifacts.files["savedmodel"], dest, symlinks=False)
        signature_specs(dest)
        return dest
    if not artifacts.has("onnx"):

        raise unservable(artifacts, "TF Serving", "a SavedModel, or ONNX (converted to a SavedModel with onnx2tf)")
    tf = _tf()

    onnx_path = artifacts.get("onnx", "a TF Serving bundle")
    feeds = artifacts.sample_inputs(batch=2)
    ref = artifacts.reference_outputs(feeds)
    # onnx2tf gets the graph in memory: it simplifies and saves back a file it is handed
    ir = IRModel(load_onnx(onnx_path), artifacts.inputs, artifacts.outputs, reference=Reference(feeds, ref),
                 sample_dims=dict(artifacts.sample_dims))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".onnx2tf-", dir=dest.parent) as tmp:
        work = Path(tmp)
        try:
            keras_model, inputs, outputs = build(ir, work, work / "convert.log")
        except BadInputError as e:  # what onnx2tf cannot convert (a missing onnx2tf stays exit 5)
            raise BadInputError(f"onnx2tf cannot convert the model: {e.reason}", path=onnx_path) from None
        with captured_output(work / "convert.log", "TensorFlow"):
            save_contract_model(tf, keras_model, inputs, outputs, dest, SIGNATURE, by_name=True)
    parity = compare(ref, run_signature(dest, feeds), tolerance_for(artifacts.precision),
                     hop="onnx→SavedModel (TF Serving)")
    parity.raise_if_failed(path=dest)
    return dest


def models_config(root: Path, mount: str = "/models") -> str:
    """`model_config_list` for every model folder under `root` (multi-model serving)."""
    entries = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and any(v.name.isdigit() for v in p.iterdir())):
        entries.append(
            "  config {\n"
            f"    name: '{d.name}'\n"
            f"    base_path: '{mount}/{d.name}'\n"
            "    model_platform: 'tensorflow'\n"
            "    model_version_policy { all {} }\n"
            "  }\n"
        )
    return "model_config_list {\n" + "".join(entries) + "}\n"


def package(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle:

    name = served_name(artifacts, options)
    model_dir = out_dir / name
    existing = sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit()) if model_dir.is_dir() else []
    version = options.version or ((existing[-1] + 1) if existing else 1)
    version_dir = model_dir / str(version)
    if version_dir.exists():
        raise BadInputError(f"version {version} of '{name}' already exists", path=version_dir, hint="pick another --version")
    model_dir.mkdir(parents=True, exist_ok=True)
    export_saved_model(artifacts, version_dir)
    files = [p for p in version_dir.rglob("*") if p.is_file()]
    config = out_dir / "models.config"
    config.write_text(models_config(out_dir))
    files.append(config)
    sample = write_json_request(out_dir / f"{name}.request.json", artifacts, named_request)
    if sample:
        files.append(sample)
    readme = out_dir / "README.md"
    readme.write_text(_readme(name, version, sample))
    files.append(readme)
    return Bundle(NAME, out_dir, files, {"model_name": name, "version": version, "versions": [*existing, version],
                                         "signature": SIGNATURE, "gpu": options.device == "gpu"})


def _readme(name: str, version: int, sample: Path | None) -> str:

    body = f"-d @{sample.name}" if sample else "-d '{\"inputs\": {...}}'"
    return f"""# TF Serving bundle: {name}

`{name}/{version}/` is a SavedModel whose `{SIGNATURE}` signature takes and returns the contract's
names; `models.config` lists every model in this folder (multi-model serving).

```sh
docker run --rm -p 8500:8500 -p 8501:8501 -v "$PWD":/models {image_for('tfserving', False)} \\
  --model_config_file=/models/models.config
curl -sf localhost:8501/v1/models/{name}
curl -s -X POST localhost:8501/v1/models/{name}:predict -H 'Content-Type: application/json' {body}
```
"""
