"""TF.js runner: a graph model (`model.json` + weight shards) run in Node.js with @tensorflow/tfjs
on its pure-JS CPU backend, as a web page runs it: `tf.loadGraphModel` through an IOHandler that
reads the files, `executeAsync` with inputs named by `model.json`'s signature and outputs read by
its output keys (`tfjs_node/run.js`, in a child `node` process; tensors go both ways as raw
little-endian files).

Node.js (18 or later, `node` on PATH or `MODELPORT_NODE`) and the npm packages pinned by
`tfjs_node/package.json` + `package-lock.json` are installed by `make setup` (`npm ci` into
`<venv>/tfjs`); `MODELPORT_TFJS_DIR` names another folder holding that `node_modules`. Either
missing is exit 5 with how to install it. TF.js has no 64-bit types: int64 inputs are fed as int32,
and outputs come back in the signature's dtypes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, MissingDependencyError, UnsafeInputError
from modelport.ir import TensorSpec
from modelport.runtimes.base import Runner

SCRIPT = Path(__file__).with_name("tfjs_node") / "run.js"
DIR_ENV = "MODELPORT_TFJS_DIR"
NODE_ENV = "MODELPORT_NODE"
RUN_TIMEOUT_S = 300.0
HINT = "run `make setup` (npm ci of src/modelport/runtimes/tfjs_node into .venv/tfjs; needs Node.js 18+ and npm) " \
       f"or set {DIR_ENV} to a folder holding node_modules/@tensorflow/tfjs"
# TensorFlow DataType enum names (signature dtypes) -> numpy dtype names
TF_DTYPES = {"DT_FLOAT": "float32", "DT_DOUBLE": "float64", "DT_HALF": "float16", "DT_INT32": "int32", "DT_INT64": "int64",
             "DT_INT16": "int16", "DT_INT8": "int8", "DT_UINT8": "uint8", "DT_BOOL": "bool", "DT_STRING": "string"}
# numpy dtype -> what TF.js takes (its dtype, the numpy dtype of the raw file)
JS_DTYPES = {"float32": "float32", "float64": "float32", "float16": "float32", "int32": "int32", "int64": "int32",
             "int16": "int32", "int8": "int32", "uint8": "int32", "bool": "bool"}


def modules_dir() -> Path:
    """The folder whose node_modules holds @tensorflow/tfjs: MODELPORT_TFJS_DIR, else <venv>/tfjs."""
    raw = os.environ.get(DIR_ENV)
    return Path(raw) if raw else Path(sys.prefix) / "tfjs"


def node_binary() -> str | None:
    return os.environ.get(NODE_ENV) or shutil.which("node")


def missing() -> str | None:
    """What is missing to run TF.js models here, with how to install it (None: ready); doctor's check."""
    node = node_binary()
    if not node or not Path(node).exists():
        return "Node.js (node; install Node.js 18+, then make setup)"
    package = modules_dir() / "node_modules" / "@tensorflow" / "tfjs" / "package.json"
    if not package.is_file():
        return f"@tensorflow/tfjs in {modules_dir()} (make setup)"
    return None


def tfjs_version() -> str | None:
    package = modules_dir() / "node_modules" / "@tensorflow" / "tfjs" / "package.json"
    try:
        return json.loads(package.read_text()).get("version")
    except (OSError, ValueError):
        return None


def require_tfjs(purpose: str = "running TF.js models") -> str:
    """The node binary, or exit 5 naming what is missing."""
    absent = missing()
    if absent:
        raise MissingDependencyError(f"{purpose} needs {absent}, which is not installed", hint=HINT)
    return node_binary()


def read_model_json(path: Path) -> dict:
    """model.json of a graph model, its weight files checked to be plain files beside it (exit 2 otherwise)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BadInputError(f"not a readable model.json: {e}", path=path) from None
    if not isinstance(doc, dict) or doc.get("format") != "graph-model" or not isinstance(doc.get("modelTopology"), dict):
        fmt = doc.get("format") if isinstance(doc, dict) else None
        raise BadInputError(f"not a TF.js graph model (format {fmt!r}; modelport runs format 'graph-model')", path=path)
    manifest = doc.get("weightsManifest") or []
    if not isinstance(manifest, list):
        raise BadInputError("weightsManifest is not a list", path=path)
    for group in manifest:
        for name in (group or {}).get("paths") or []:
            shard = path.parent / str(name)
            if Path(str(name)).name != str(name) or name in ("", ".", ".."):
                raise UnsafeInputError(f"weight shard '{name}' is not a file name beside model.json", path=path)
            if shard.is_symlink():
                raise UnsafeInputError(f"weight shard {name} is a symbolic link", path=path)
            if not shard.is_file():
                raise BadInputError(f"weight shard {name} is missing beside it", path=path)
    return doc


def signature_specs(doc: dict) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs) of model.json's signature: its keys, dtypes and shapes (-1: a dynamic dim,
    named as modelport's metadata names it (`dims`), else `batch` on axis 0 and KEY_dimN)."""
    signature = doc.get("signature") or {}
    named = ((doc.get("userDefinedMetadata") or {}).get("modelport") or {}).get("dims") or {}

    def specs(entries: dict) -> list[TensorSpec]:
        out = []
        for key, info in (entries or {}).items():
            dtype = TF_DTYPES.get(info.get("dtype", "DT_FLOAT"), "float32")
            dims = (info.get("tensorShape") or {}).get("dim") or []
            shape: list = [int(d.get("size", -1)) for d in dims]
            names = named.get(key) if isinstance(named.get(key), dict) else {}
            shape = [d if d >= 0 else str(names.get(str(i)) or ("batch" if i == 0 else f"{key}_dim{i}"))
                     for i, d in enumerate(shape)]
            out.append(TensorSpec(name=key, dtype=dtype, shape=shape))
        return out

    return specs(signature.get("inputs")), specs(signature.get("outputs"))


class TFJSRunner(Runner):
    """A graph model's `model.json`, run in Node.js with @tensorflow/tfjs (CPU backend)."""

    name = "tfjs"
    imports = ("tensorflow", "onnx2tf")

    def __init__(self, model, **_options):
        self.path = Path(model)
        if self.path.is_dir():
            self.path = self.path / "model.json"
        self.node = require_tfjs()
        self.doc = read_model_json(self.path)
        self._inputs, self._outputs = signature_specs(self.doc)
        if not self._inputs or not self._outputs:
            raise BadInputError("model.json has no signature inputs/outputs to feed and read", path=self.path)
        self.version = tfjs_version()

    def input_specs(self) -> list[TensorSpec]:
        return list(self._inputs)

    def output_specs(self) -> list[TensorSpec]:
        return list(self._outputs)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [s.name for s in self._inputs]
        absent = [n for n in names if n not in feeds]
        if absent:
            raise BadInputError(f"missing inputs {absent}; the model expects {names}")
        with tempfile.TemporaryDirectory(prefix="modelport-tfjs-") as tmp:
            work = Path(tmp)
            request = {"model": str(self.path.resolve()), "out": str(work), "inputs": []}
            for i, spec in enumerate(self._inputs):
                x = np.asarray(feeds[spec.name])
                js = JS_DTYPES.get(x.dtype.name)
                if js is None:
                    raise BadInputError(f"input {spec.name}: TF.js takes no {x.dtype.name} tensors")
                raw = x.astype(np.uint8 if js == "bool" else js).astype(np.dtype(np.uint8 if js == "bool" else js).newbyteorder("<"))
                f = work / f"in_{i}.bin"
                f.write_bytes(np.ascontiguousarray(raw).tobytes())
                request["inputs"].append({"name": spec.name, "dtype": js, "shape": [int(d) for d in x.shape], "file": str(f)})
            result = self._node(work, request)
            want = {s.name: s.dtype for s in self._outputs}
            out = {}
            for o in result["outputs"]:
                raw_dtype = np.uint8 if o["dtype"] == "bool" else np.dtype(o["dtype"]).newbyteorder("<")
                y = np.fromfile(o["file"], dtype=raw_dtype).reshape(o["shape"])
                dtype = want.get(o["name"], o["dtype"])
                out[o["name"]] = y.astype(dtype if dtype != "string" else y.dtype)
            return out

    def _node(self, work: Path, request: dict) -> dict:
        (work / "request.json").write_text(json.dumps(request))
        env = dict(os.environ, NODE_PATH=str(modules_dir() / "node_modules"))
        try:
            proc = subprocess.run([self.node, str(SCRIPT), str(work / "request.json")], capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL, cwd=work)
        except subprocess.TimeoutExpired:
            raise BadInputError(f"TF.js did not finish within {RUN_TIMEOUT_S:g} s", path=self.path) from None
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("tfjs error:")]
            why = lines[-1][len("tfjs error:"):].strip() if lines else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise BadInputError(f"TF.js cannot run the model: {why}", path=self.path)
        return json.loads((work / "result.json").read_text())

    def io_note(self) -> str:
        return f"TF.js {self.version or '?'} in Node.js (cpu backend), fed and read by model.json's signature"


def open_model_json(path: str | Path, **options) -> TFJSRunner:
    """A user's model.json (or the folder holding it), as `validate` opens it."""
    return TFJSRunner(path, **options)


def inspect_model_json(path: str | Path) -> dict:
    """What `inspect` shows for a TF.js graph model: signature I/O, op histogram, weights, size."""
    from collections import Counter

    path = Path(path)
    if path.is_dir():
        path = path / "model.json"
    doc = read_model_json(path)
    inputs, outputs = signature_specs(doc)
    nodes = (doc.get("modelTopology") or {}).get("node") or []
    ops = Counter(n.get("op", "?") for n in nodes)
    weights = [w for g in doc.get("weightsManifest") or [] for w in g.get("weights") or []]
    stored = Counter((w.get("quantization") or {}).get("dtype") or w.get("dtype") for w in weights)
    files = [path] + [path.parent / p for g in doc.get("weightsManifest") or [] for p in g.get("paths") or []]
    params = sum(int(np.prod(w.get("shape") or [1])) for w in weights if w.get("dtype") == "float32")
    meta = (doc.get("userDefinedMetadata") or {}).get("modelport") or {}
    bounds = meta.get("bounds") if isinstance(meta.get("bounds"), dict) else {}
    # the declared bounds of each input's named dims (`inspect` shows them beside the -1s)
    declared = {s.name: {d: bounds[d] for d in s.shape if isinstance(d, str) and isinstance(bounds.get(d), dict)}
                for s in inputs}
    return {
        "format": "tfjs-graph-model",
        "converted_by": doc.get("convertedBy"),
        "generated_by": doc.get("generatedBy"),
        "inputs": [s.to_dict() for s in inputs],
        "outputs": [s.to_dict() for s in outputs],
        "nodes": len(nodes),
        "ops": dict(ops.most_common()),
        "parameters": int(params),
        "weights": dict(stored.most_common()),
        "precision": meta.get("precision"),
        **({"dynamic_dims": {k: v for k, v in declared.items() if v}} if any(declared.values()) else {}),
        "files": [str(f) for f in files],
        "size": sum(f.stat().st_size for f in files if f.exists()),
    }
