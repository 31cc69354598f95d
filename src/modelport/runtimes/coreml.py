"""Core ML: reading `.mlpackage` files everywhere, running them where Core ML runs (macOS).

Core ML's runtime is part of Apple's operating systems: coremltools predicts through it on macOS
only, and on Linux it can convert and read models but not run them. So here:

- `CoreMLRunner(path)` reads the package's spec (`coremltools.utils.load_spec`, no model load):
  `input_specs()` and `output_specs()` from the spec's feature descriptions, `describe()` with its
  spec version, model type and compute precision, and `cannot_run` (why it cannot run here, None
  on macOS). `run(feeds)` predicts with `coremltools.models.MLModel` on macOS (CPU only, the
  default elsewhere being the GPU or Neural Engine, whose fp16 kernels are not what a parity
  check against fp32 references judges), and on any other system is exit 4 saying why.
- the names: Core ML feature names are identifiers, so coremltools renames a contract name such as
  `input.1` (`input_1`). modelport records the renames in the package's metadata
  (`com.modelport.io_names`: contract name -> feature name), and the runner speaks the contract's
  names, as a TFLite signature does; a package without that entry is read by its feature names.
- Core ML has no 64-bit integer I/O: a contract's int64 tensor is int32 in the package, recorded
  in `com.modelport.io_dtypes` and reported by `io_dtypes()`; the contract check accepts exactly those.
- `open_mlpackage(path)` (what `validate` opens a user's package with) reads the spec in a clean
  child process (`runtimes/isolated.py`), with coremltools and no other framework, as its users
  would; `inspect_mlpackage(path)` is what `inspect` shows.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, ValidationError, one_line
from modelport.ir import TensorSpec
from modelport.run.quiet_call import captured_output
from modelport.run.staging import describe_files
from modelport.runtimes.base import Runner
from modelport.runtimes.isolated import IsolatedRunner, absent_to_find_spec

RUNTIME = "coreml"
# the user-defined metadata keys modelport writes into the packages it emits
META_PRECISION = "com.modelport.precision"
META_NAMES = "com.modelport.io_names"
META_DTYPES = "com.modelport.io_dtypes"
META_CONTRACT = "com.modelport.contract"
META_DIMS = "com.modelport.dims"  # {input: {axis: the contract's dim name}} for the flexible dims
CANNOT_RUN = ("Core ML runs on macOS (and iOS) only; on {system} coremltools converts and reads models but cannot run them")
# ArrayFeatureType.ArrayDataType names -> numpy dtype names
ARRAY_DTYPES = {"FLOAT32": "float32", "FLOAT16": "float16", "DOUBLE": "float64", "INT32": "int32", "INT8": "int8"}


def make_reproducible(package: Path) -> None:
    """The package written again byte for byte by a rerun: coremltools names the Manifest's items
    by random UUIDs (here: UUIDs derived from each item's path and the model's bytes), and stamps the
    conversion date into the metadata (dropped by the emitter before saving). A file coremltools
    leaves beside the model for ExecuTorch's debugger is not part of the package and is removed."""
    import hashlib
    import uuid

    (package / "executorch_debug_handle_mapping.json").unlink(missing_ok=True)
    manifest = package / "Manifest.json"
    doc = json.loads(manifest.read_text())
    digest = hashlib.sha256()
    for f in sorted(p for p in (package / "Data").rglob("*") if p.is_file()):
        digest.update(str(f.relative_to(package)).encode() + b"\0" + f.read_bytes())
    text = manifest.read_text()
    for key, item in doc.get("itemInfoEntries", {}).items():
        text = text.replace(key, str(uuid.uuid5(uuid.NAMESPACE_URL, f"modelport:{item.get('path')}:{digest.hexdigest()}")))
    manifest.write_text(text)


def cannot_run_reason() -> str | None:
    """Why Core ML cannot run here, or None where it can (macOS)."""
    if sys.platform == "darwin":
        return None
    return CANNOT_RUN.format(system={"linux": "Linux", "win32": "Windows"}.get(sys.platform, sys.platform))


# frameworks `import coremltools` loads to offer their converters (about 15 s on two cores), which
# modelport does not use from it: kept out of that import unless something loaded them already
NOT_FOR_COREMLTOOLS = ("tensorflow", "tf_keras", "keras", "executorch", "sklearn", "xgboost", "libsvm")


TF_FAMILY = ("tensorflow", "tf_keras", "keras")


class _Unneeded:
    """A meta-path finder that refuses the NOT_FOR_COREMLTOOLS modules while coremltools is imported,
    except those this process loaded already (TensorFlow's family as a whole: a loaded TensorFlow
    imports Keras modules on use)."""

    def __init__(self):
        loaded = {m for m in NOT_FOR_COREMLTOOLS if m in sys.modules}
        if loaded & set(TF_FAMILY):
            loaded |= set(TF_FAMILY)
        self.names = frozenset(NOT_FOR_COREMLTOOLS) - loaded

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named '{fullname}' (not loaded for coremltools)", name=fullname)
        return None


def require_coremltools(purpose: str = "Core ML"):
    """coremltools, imported quietly (it prints notices about untested framework versions) and
    without the frameworks it would load for converters modelport does not use, or exit 5 naming the extra."""
    import logging
    import warnings


    logging.getLogger("coremltools").setLevel(logging.ERROR)
    if sys.modules.get("coremltools") is not None:
        return sys.modules["coremltools"]
    import tempfile


    unneeded = _Unneeded()
    sys.meta_path.insert(0, unneeded)
    # to `find_spec` the refused modules are absent (None), as where they are not installed: torch._dynamo,
    # imported on the way, probes for tensorflow that way and is left half-initialised by an exception
    undo = absent_to_find_spec(unneeded.names)
    try:
        with tempfile.TemporaryDirectory(prefix="modelport-coremltools-") as tmp, \
                captured_output(Path(tmp) / "import.log", "coremltools"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its notices about untested torch versions and its missing native library
            return require("coremltools", purpose=purpose)
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Unneeded)]
        undo()


def check_package(path: Path) -> Path:
    """The package folder (a `.mlpackage` or a folder holding Manifest.json); exit 2 otherwise."""
    path = Path(path)
    if path.name == "Manifest.json" and path.is_file():
        path = path.parent
    if not (path.is_dir() and (path / "Manifest.json").is_file()):
        raise BadInputError("not a Core ML package (a .mlpackage folder holding Manifest.json)", path=path)
    return path


def load_spec(path: str | Path):
    """The package's Model spec (protobuf), without loading the model into Core ML; exit 2 when unreadable."""
    path = check_package(Path(path))
    ct = require_coremltools("reading a Core ML package")
    try:
        return ct.utils.load_spec(str(path))
    except Exception as e:
        raise BadInputError(f"cannot read the Core ML package: {one_line(e, 200, typed=True)}", path=path) from None


def metadata(spec) -> dict[str, str]:
    return dict(spec.description.metadata.userDefined)


def _json_meta(spec, key: str) -> dict:
    raw = metadata(spec).get(key)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def flexible_dims(feature) -> dict[int, dict]:
    """{axis: its form} for each dim of a multi-array feature that takes more than one size: a
    `ct.RangeDim` ({"kind": "range", "min", "max"}; an unbounded top is max -1) or the sizes of
    `ct.EnumeratedShapes` ({"kind": "sizes", "sizes"})."""
    if feature.type.WhichOneof("Type") != "multiArrayType":
        return {}
    array = feature.type.multiArrayType
    which = array.WhichOneof("ShapeFlexibility")
    out: dict[int, dict] = {}
    if which == "shapeRange":
        for i, r in enumerate(array.shapeRange.sizeRanges):
            if r.lowerBound != r.upperBound:
                out[i] = {"kind": "range", "min": int(r.lowerBound), "max": int(r.upperBound)}
    elif which == "enumeratedShapes":
        shapes = [list(s.shape) for s in array.enumeratedShapes.shapes]
        for i in range(len(shapes[0]) if shapes else 0):
            sizes = sorted({int(s[i]) for s in shapes if i < len(s)})
            if len(sizes) > 1:
                out[i] = {"kind": "sizes", "sizes": sizes}
    return out


def _feature_spec(feature, name: str, dim_names: dict | None = None) -> TensorSpec:
    from coremltools.proto import FeatureTypes_pb2

    kind = feature.type.WhichOneof("Type")
    if kind != "multiArrayType":
        return TensorSpec(name, dtype=kind or "unknown", shape=[])
    array = feature.type.multiArrayType
    dtype = ARRAY_DTYPES.get(FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(array.dataType), "unknown")
    shape: list = [int(d) for d in array.shape]
    for i in flexible_dims(feature):  # a flexible dim, under the contract's name where the package keeps it
        if i < len(shape):
            shape[i] = (dim_names or {}).get(str(i), f"{name}_dim{i}")
    return TensorSpec(name, dtype=dtype, shape=shape)


def io_specs(spec) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs) under the contract's names where the package records them."""
    names = {v: k for k, v in _json_meta(spec, META_NAMES).items()}  # feature name -> contract name
    dims = _json_meta(spec, META_DIMS)
    d = spec.description
    return ([_feature_spec(f, names.get(f.name, f.name), dims.get(names.get(f.name, f.name))) for f in d.input],
            [_feature_spec(f, names.get(f.name, f.name)) for f in d.output])


def input_dims(spec) -> dict[str, dict[str, dict]]:
    """Per input, each flexible dim's form (`flexible_dims`) under the contract's dim name."""
    names = {v: k for k, v in _json_meta(spec, META_NAMES).items()}
    dims = _json_meta(spec, META_DIMS)
    out = {}
    for f in spec.description.input:
        name = names.get(f.name, f.name)
        forms = {dims.get(name, {}).get(str(i), f"{name}_dim{i}"): form for i, form in flexible_dims(f).items()}
        if forms:
            out[name] = forms
    return out


def _main_block(spec):
    if spec.WhichOneof("Type") != "mlProgram":
        return None
    fn = spec.mlProgram.functions.get("main")
    if fn is None:
        return None
    return fn.block_specializations.get(fn.opset) or next(iter(fn.block_specializations.values()), None)


def compute_precision(spec) -> str:
    """The precision the program computes in: "fp16" where its ops produce FLOAT16 tensors (how an
    ML Program converted with compute_precision FLOAT16 looks), else "fp32"."""
    from coremltools.proto import MIL_pb2

    block = _main_block(spec)
    if block is None:
        return metadata(spec).get(META_PRECISION, "fp32")
    fp16 = MIL_pb2.DataType.Value("FLOAT16")
    for op in block.operations:
        if op.type == "const":
            continue
        if any(o.type.WhichOneof("type") == "tensorType" and o.type.tensorType.dataType == fp16 for o in op.outputs):
            return "fp16"
    return "fp32"


def ops_of(spec) -> Counter:
    block = _main_block(spec)
    if block is not None:
        return Counter(op.type for op in block.operations)
    if spec.WhichOneof("Type") == "neuralNetwork":
        return Counter(layer.WhichOneof("layer") for layer in spec.neuralNetwork.layers)
    return Counter()


class CoreMLRunner(Runner):
    """A Core ML package: its I/O read from the spec everywhere, run through Core ML on macOS only."""

    name = RUNTIME
    imports = ("coremltools",)

    def __init__(self, model, **options):
        self.path = check_package(Path(model))
        self.spec = load_spec(self.path)
        self.inputs, self.outputs = io_specs(self.spec)
        self.names = _json_meta(self.spec, META_NAMES)  # contract name -> feature name
        self._model = None

    @classmethod
    def cannot_run(cls) -> str | None:
        return cannot_run_reason()

    def input_specs(self) -> list[TensorSpec]:
        return list(self.inputs)

    def output_specs(self) -> list[TensorSpec]:
        return list(self.outputs)

    def io_dtypes(self) -> dict[str, str]:
        """{contract name: the package's dtype} for the tensors the contract has at another dtype (int64 -> int32)."""
        return _json_meta(self.spec, META_DTYPES)

    def describe(self) -> dict:
        return {"cannot_run": self.cannot_run(), "spec_version": int(self.spec.specificationVersion),
                "model_type": self.spec.WhichOneof("Type"), "compute_precision": compute_precision(self.spec),
                "io_dtypes": self.io_dtypes(), "io_names": dict(self.names), "dims": input_dims(self.spec)}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.cannot_run():
            raise ValidationError(f"the Core ML package cannot be run here: {self.cannot_run()}", path=self.path,
                                  hint="validate it on macOS: modelport validate REFERENCE model.mlpackage")
        if self._model is None:
            ct = require_coremltools()
            self._model = ct.models.MLModel(str(self.path), compute_units=ct.ComputeUnit.CPU_ONLY)
        want = {s.name: s for s in self.inputs}
        data = {self.names.get(k, k): np.asarray(v).astype(want[k].dtype) if k in want else np.asarray(v) for k, v in feeds.items()}
        out = self._model.predict(data)
        back = {self.names.get(s.name, s.name): s.name for s in self.outputs}
        return {back.get(k, k): np.asarray(v) for k, v in out.items()}


def open_mlpackage(path: str | Path):
    """A user's Core ML package as a runner (`validate`): read in a clean child process with coremltools alone."""

    runner = IsolatedRunner(RUNTIME, check_package(Path(path)), clean=True)
    runner.describe()  # an unreadable package is exit 2 here, before anything runs
    return runner


def inspect_mlpackage(path: str | Path) -> dict:
    """What `inspect` shows for a Core ML package: I/O, spec version, model type, precision, ops, size."""

    path = check_package(Path(path))
    spec = load_spec(path)
    inputs, outputs = io_specs(spec)
    ops = ops_of(spec)
    meta = metadata(spec)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return {
        "format": "coreml-mlpackage",
        "model_type": {"mlProgram": "ML Program", "neuralNetwork": "neural network"}.get(spec.WhichOneof("Type"), spec.WhichOneof("Type")),
        "spec_version": int(spec.specificationVersion),
        "precision": compute_precision(spec),
        "inputs": [s.to_dict() for s in inputs],
        "outputs": [s.to_dict() for s in outputs],
        **({"dynamic_dims": input_dims(spec)} if input_dims(spec) else {}),
        "nodes": sum(n for op, n in ops.items() if op != "const"),
        "ops": dict(ops.most_common()),
        "metadata": meta,
        "producer": f"coremltools {meta['com.github.apple.coremltools.version']}" if meta.get("com.github.apple.coremltools.version") else None,
        "note": cannot_run_reason(),
        **describe_files(path, files, None),
    }
