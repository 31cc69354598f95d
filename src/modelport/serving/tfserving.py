"""TF Serving bundle: `<name>/<version>/saved_model.pb` + `variables/`, and `models.config`.

A SavedModel artifact (e.g. from a Keras `model.export()`) is copied as it is. From ONNX, the
model goes through onnx2tf and is saved again behind a `serving_default` signature whose input
and output names, dtypes and dynamic dims are the contract's; channel-first inputs stay
channel-first. The exported SavedModel is loaded back and its signature run on the contract's
sample inputs, checked for parity against the ONNX artifact in onnxruntime: a breach is exit 4.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError
from modelport.runtimes.savedmodel import SIGNATURE, run_signature, signature_specs
from modelport.serving import Bundle, PackageOptions
from modelport.serving.bundle import Artifacts, served_name

NAME = "tfserving"
DESCRIPTION = "TF Serving SavedModel repository (<name>/<version>/) + models.config, parity-checked"
# channels-last -> channels-first permutations onnx2tf may leave on an output, by rank
_TO_CHANNELS_FIRST = {3: [0, 2, 1], 4: [0, 3, 1, 2], 5: [0, 4, 1, 2, 3]}


def _tf():
    from modelport.deps import require

    return require("tensorflow", purpose="TF Serving bundles")


def _output_perms(keras_model, artifacts: Artifacts, feeds: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> list:
    """Per output, the permutation that brings onnx2tf's channels-last output back to the contract's layout."""
    args = [feeds[s.name] for s in artifacts.inputs]
    ys = keras_model(args if len(args) > 1 else args[0])
    ys = ys if isinstance(ys, (list, tuple)) else [ys]
    if len(ys) != len(artifacts.outputs):
        raise BadInputError(f"onnx2tf's model has {len(ys)} outputs, the contract {len(artifacts.outputs)}")
    perms = []
    for s, y in zip(artifacts.outputs, ys, strict=True):
        y = np.asarray(y)
        want = ref[s.name].shape
        perm = _TO_CHANNELS_FIRST.get(y.ndim)
        if y.shape != want and perm and tuple(np.transpose(y, perm).shape) == want:
            perms.append(perm)
        else:
            perms.append(None)
    return perms


def _stable_fingerprint(dest: Path) -> None:
    """TensorFlow stamps a random `uuid` into `fingerprint.pb` on every save; derive it from the
    fingerprint's content hashes instead, so the same model saved twice gives the same bytes."""
    path = dest / "fingerprint.pb"
    if not path.is_file():
        return
    from tensorflow.core.protobuf import fingerprint_pb2

    fp = fingerprint_pb2.FingerprintDef()
    fp.ParseFromString(path.read_bytes())
    fp.uuid = str(int.from_bytes(hashlib.sha256(_without_uuid(fp)).digest()[:16], "big"))
    path.write_bytes(fp.SerializeToString(deterministic=True))


def _without_uuid(fp) -> bytes:
    copy = type(fp)()
    copy.CopyFrom(fp)
    copy.ClearField("uuid")
    return copy.SerializeToString(deterministic=True)


def export_saved_model(artifacts: Artifacts, dest: Path) -> Path:
    """Write a SavedModel for the contract at `dest` (copied, or converted from ONNX with onnx2tf)."""
    from modelport.validation import compare, tolerance_for

    if artifacts.has("savedmodel"):
        shutil.copytree(artifacts.files["savedmodel"], dest, symlinks=False)
        signature_specs(dest)
        return dest
    if not artifacts.has("onnx"):
        from modelport.serving.bundle import unservable

        raise unservable(artifacts, "TF Serving", "a SavedModel, or ONNX (converted to a SavedModel with onnx2tf)")
    tf = _tf()
    from modelport.deps import require

    onnx2tf = require("onnx2tf", purpose="converting ONNX to a SavedModel")
    onnx_path = artifacts.get("onnx", "a TF Serving bundle")
    channel_first = [s.name for s in artifacts.inputs if len(s.shape) >= 3]
    feeds = artifacts.sample_inputs(batch=2)
    ref = artifacts.reference_outputs(feeds)
    # onnx2tf rewrites the file it is given (simplified in place): it works on a copy inside the staging folder
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".onnx2tf-", dir=dest.parent) as tmp, contextlib.redirect_stdout(sys.stderr):
        work_onnx = artifacts.copy_onnx(Path(tmp) / "onnx")
        try:
            keras_model = onnx2tf.convert(
                input_onnx_file_path=str(work_onnx), output_folder_path=str(Path(tmp) / "tf"), disable_model_save=True,
                non_verbose=True, verbosity="error", keep_ncw_or_nchw_or_ncdhw_input_names=channel_first or None,
            )
        except Exception as e:
            raise BadInputError(f"onnx2tf cannot convert the model: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                path=onnx_path) from None
    perms = _output_perms(keras_model, artifacts, feeds, ref)
    signature = [tf.TensorSpec([d if isinstance(d, int) else None for d in s.shape], tf.as_dtype(s.dtype), name=s.name)
                 for s in artifacts.inputs]
    module = tf.Module()
    module.model = keras_model
    out_specs = artifacts.outputs

    @tf.function(input_signature=signature)
    def serve(*args):
        ys = module.model(list(args) if len(args) > 1 else args[0])
        ys = ys if isinstance(ys, (list, tuple)) else [ys]
        return {s.name: tf.cast(tf.transpose(y, p) if p else y, tf.as_dtype(s.dtype)) for s, y, p in zip(out_specs, ys, perms, strict=True)}

    tf.saved_model.save(module, str(dest), signatures={SIGNATURE: serve})
    _stable_fingerprint(dest)
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
    from modelport.serving.requests import named_request, write_json_request

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
    from modelport.serving.docker import image_for

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
