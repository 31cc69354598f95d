"""TFLite flatbuffers (`.tflite`) as sources, converted with tf2onnx, referenced by the LiteRT interpreter.

FlatBuffers have no bounds checks of their own and the interpreter may abort on a hostile file
(TFSA-2018-003, CVE-2020-15211), so the first load, the tensor details and the reference run
happen in a child process with a timeout. A child killed by a signal, or one that overruns, is
reported as a bad input (exit 2) naming the signal; the parent never touched the file by then.
Names: a signature's keys when the file has one (`--signature` picks among several), else the
tensor names without `serving_default_` and `:0`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from modelport.errors import BadInputError, ModelportError
from modelport.file_checks import check_model_file
from modelport.ir import IRModel, TensorSpec

NAME = "tflite"
DESCRIPTION = "TFLite flatbuffer (.tflite), loaded first in a crash-isolated child process"
IDENTIFIER = b"TFL3"
PROBE_TIMEOUT_S = 120.0
PROBE_CODE = "import sys; from modelport.parsers.tflite import probe_main; sys.exit(probe_main(sys.argv[1]))"


def sniff(path: Path) -> bool:
    if not path.is_file():
        return False
    if path.suffix.lower() == ".tflite":
        return True
    with open(path, "rb") as f:
        return f.read(8)[4:8] == IDENTIFIER


def check_header(path: Path) -> None:
    """The cheap checks: size and the 'TFL3' file identifier at bytes 4..8."""
    path = check_model_file(path, kind="TFLite model")
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[4:8] != IDENTIFIER:
        raise BadInputError(f"not a TFLite flatbuffer: identifier {head[4:8]!r}, expected b'TFL3'", path=path)


def run_isolated(code: str, args: list[str], *, path, timeout: float = PROBE_TIMEOUT_S, what: str = "the TFLite loader"):
    """Run `python -c code args` in a child; a signal death or timeout becomes BadInputError."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise BadInputError(f"{what} did not finish within {timeout:g} s (corrupt or hostile file?)", path=path) from None
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        raise BadInputError(f"{what} crashed ({sig}): the file is corrupt or not a valid model", path=path)
    return proc


def probe(path: Path, spec, *, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Load the file in a child, build the input contract and run the reference there."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="modelport-tflite-") as tmp:
        work = Path(tmp)
        request = {
            "path": str(Path(path).resolve()), "inputs": [s.to_dict() for s in spec.inputs],
            "input_names": spec.options.get("input_names"), "signature": spec.options.get("signature"),
            "sample_dims": spec.sample_dims, "seed": spec.seed,
        }
        (work / "request.json").write_text(json.dumps(request))
        proc = run_isolated(PROBE_CODE, [str(work)], path=path, timeout=timeout)
        error = work / "error.json"
        if error.exists():
            e = json.loads(error.read_text())
            cls = {2: BadInputError}.get(e.get("exit_code"), ModelportError)
            err = cls(e["reason"], path=path, hint=e.get("hint"))
            if cls is ModelportError:
                err.exit_code = e.get("exit_code", 1)
            raise err
        if proc.returncode != 0 or not (work / "response.json").exists():
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            raise BadInputError(f"the TFLite loader failed: {tail[0][:300]}", path=path)
        result = json.loads((work / "response.json").read_text())
        with np.load(work / "arrays.npz", allow_pickle=False) as z:
            result["sample"] = {k[3:]: z[k] for k in z.files if k.startswith("in/")}
            result["reference"] = {k[4:]: z[k] for k in z.files if k.startswith("out/")}
    return result


def _names(interp, details, wanted_signature: str | None, kind: str) -> list[str]:
    """Signature keys for the tensors when a signature covers them, else cleaned tensor names."""
    from modelport.runtimes.tflite import tflite_name

    try:
        full = interp._get_full_signature_list() or {}
    except Exception:
        full = {}
    if wanted_signature and wanted_signature not in full:
        raise BadInputError(f"no signature '{wanted_signature}'; the TFLite model has {sorted(full)}")
    key = wanted_signature or (next(iter(full)) if len(full) == 1 else None)
    by_index = {idx: name for name, idx in full.get(key, {}).get(kind, {}).items()} if key else {}
    names = [by_index.get(d["index"]) or tflite_name(d["name"]) for d in details]
    if len(set(names)) != len(names):
        names = [f"{kind[:-1]}_{i}" for i in range(len(names))]
    return names


def probe_main(workdir: str) -> int:
    """The child's side of `probe`: everything that touches the flatbuffer through the interpreter."""
    import numpy as np

    from modelport.parsers import SourceSpec
    from modelport.parsers.tf_common import merge_inputs, spec_from_tf
    from modelport.runtimes.tflite import TFLiteRunner, load_interpreter
    from modelport.samples import make_inputs

    work = Path(workdir)
    req = json.loads((work / "request.json").read_text())
    try:
        path = Path(req["path"])
        interp = load_interpreter(path)
        ins, outs = interp.get_input_details(), interp.get_output_details()
        in_names = _names(interp, ins, req.get("signature"), "inputs")
        out_names = _names(interp, outs, req.get("signature"), "outputs")
        graph = [spec_from_tf(n, [None if s < 0 else int(s) for s in d.get("shape_signature", d["shape"])], np.dtype(d["dtype"]))
                 for n, d in zip(in_names, ins, strict=True)]
        user = SourceSpec(inputs=[TensorSpec.from_dict(d) for d in req["inputs"]], options={"input_names": req.get("input_names")})
        specs = merge_inputs(graph, user, path)
        sample = make_inputs(specs, req.get("sample_dims") or {}, seed=req.get("seed", 0))
        runner = TFLiteRunner(path, input_names=[s.name for s in specs], output_names=out_names)
        ref = runner.run(sample)
        arrays = {f"in/{k}": v for k, v in sample.items()}
        arrays.update({f"out/{k}": np.asarray(v) for k, v in ref.items()})
        with open(work / "arrays.npz", "wb") as f:
            np.savez(f, **arrays)
        response = {
            "inputs": [s.to_dict() for s in specs],
            "tensor_inputs": [d["name"] for d in ins], "tensor_outputs": [d["name"] for d in outs],
            "outputs": out_names,
            "output_shapes": {n: [None if s < 0 else int(s) for s in d.get("shape_signature", d["shape"])] for n, d in zip(out_names, outs, strict=True)},
            "signatures": sorted(interp.get_signature_list() or {}),
            "ops": _op_histogram(interp),
        }
        (work / "response.json").write_text(json.dumps(response))
        return 0
    except ModelportError as e:
        (work / "error.json").write_text(json.dumps({"exit_code": e.exit_code, "reason": e.reason, "hint": e.hint}))
        return 2
    except Exception as e:
        text = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        (work / "error.json").write_text(json.dumps({"exit_code": 2, "reason": f"not a valid TFLite model: {text}"}))
        return 2


def _op_histogram(interp) -> dict:
    from collections import Counter

    try:
        ops = Counter(o["op_name"] for o in interp._get_ops_details())
    except Exception:
        return {}
    return dict(ops.most_common())


def parse(source, spec) -> IRModel:
    from modelport.parsers import tf_common

    path = Path(source)
    check_header(path)
    probed = probe(path, spec)
    specs = [TensorSpec.from_dict(d) for d in probed["inputs"]]
    names = tf_common.rename_outputs(probed["outputs"], spec, path)
    reference = dict(zip(names, (probed["reference"][n] for n in probed["outputs"]), strict=True))
    tf = tf_common.import_tf()
    tf2onnx = tf_common.import_tf2onnx()
    try:
        import warnings

        with tf_common.stdout_to_stderr(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated.*")
            model, _ = tf2onnx.convert.from_tflite(str(path), opset=spec.opset)
    except Exception as e:
        from modelport.errors import UnsupportedError

        raise UnsupportedError(f"tf2onnx failed on the TFLite model: {tf_common.first_line(e)}", path=path) from None
    tf_common.check_converted(model, path)
    mapping = dict(zip(probed["tensor_inputs"], [s.name for s in specs], strict=True))
    mapping.update(zip(probed["tensor_outputs"], names, strict=True))
    onnx_in = [v.name for v in model.graph.input]
    if not set(mapping).issuperset(onnx_in):
        mapping.update(zip(onnx_in, [s.name for s in specs], strict=True))
    tf_common.rename_values(model, mapping)
    out_shapes = {n: probed["output_shapes"].get(o) for n, o in zip(names, probed["outputs"], strict=True)}
    from modelport.deps import version_of

    litert = version_of("ai_edge_litert")
    producer = f"ai-edge-litert {litert} interpreter" if litert else f"tensorflow {tf.__version__} tf.lite interpreter"
    return tf_common.build_ir(
        model, specs, out_shapes, probed["sample"], reference, producer=producer,
        provenance={"framework": "tflite", "format": "tflite", "path": str(path), "signatures": probed["signatures"],
                    "tensorflow": tf.__version__},
        spec=spec, path=path,
    )


def inspect(path: Path) -> dict:
    """Inputs, outputs, signatures and op histogram, read in the crash-isolated child."""
    from modelport.parsers import SourceSpec

    path = Path(path)
    check_header(path)
    probed = probe(path, SourceSpec(path=path))
    shapes = probed["output_shapes"]
    return {
        "format": "tflite",
        "inputs": probed["inputs"],
        "outputs": [{"name": n, "shape": shapes.get(n)} for n in probed["outputs"]],
        "signatures": probed["signatures"],
        "ops": probed["ops"],
        "size": path.stat().st_size,
    }
