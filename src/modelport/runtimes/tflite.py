"""LiteRT (TFLite) interpreter runner.

With `signature` (what the TFLite emitter asks for, and what a client of its files does), the
file runs through that SignatureDef: feeds are given and outputs come back by the signature's
keys, exactly as `interpreter.get_signature_runner(signature)(**feeds)` returns them. Without it,
a file whose one signature takes exactly the feeds' names runs the same way; any other file (one
from an older converter, with no signature) runs by its input/output tensors: inputs are matched
by name (TFLite names such as 'serving_default_x:0' are matched on their stripped form) and
otherwise by position, and dynamic dims are resized before allocation.

Quantised I/O (full-integer models with int8/uint8 inputs or outputs): a float feed for an
int8/uint8 input is quantised with that tensor's scale and zero point (q = round(x / scale) + zero,
clipped to the type's range), and int8/uint8 outputs are dequantised ((q - zero) * scale), so
callers compare float values whatever the file's I/O type. Integer feeds are passed unchanged.

With `fit_layout` (what `validate` asks for a user's file), feeds are matched to the inputs by
name and a channels-first feed is transposed to channels-last where that is what fits the file.

This runner loads the file in the calling process: use it for files this program wrote. For a
user's file, `open_untrusted(path)` checks its identifier and runs it in a child process
(`runtimes.isolated.IsolatedRunner`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, one_line
from modelport.ir import TensorSpec
from modelport.run.file_checks import check_model_file
from modelport.run.quiet_call import silenced_output
from modelport.runtimes.base import Runner
from modelport.runtimes.isolated import IsolatedRunner

IDENTIFIER = b"TFL3"


def load_interpreter(path: str | Path, threads: int | None = None, *, delegates: bool = True):
    """The LiteRT interpreter for `path`; `delegates=False` leaves out the default delegate (XNNPack)."""

    try:
        module = require("ai_edge_litert.interpreter", purpose="running TFLite models")
        Interpreter, resolvers = module.Interpreter, module.OpResolverType
    except Exception:
        tf = require("tensorflow", purpose="running TFLite models")
        Interpreter, resolvers = tf.lite.Interpreter, tf.lite.experimental.OpResolverType
    extra = {} if delegates else {"experimental_op_resolver_type": resolvers.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    try:
        return Interpreter(model_path=str(path), num_threads=threads, **extra)
    except ValueError as e:
        raise BadInputError(f"not a valid TFLite model: {one_line(e)}", path=path) from None


def check_header(path: Path) -> None:
    """The cheap checks: size and the 'TFL3' file identifier at bytes 4..8."""

    path = check_model_file(path, kind="TFLite model")
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[4:8] != IDENTIFIER:
        raise BadInputError(f"not a TFLite flatbuffer: identifier {head[4:8]!r}, expected b'TFL3'", path=path)


def open_untrusted(path: str | Path, **options):
    """A user's `.tflite`: its identifier checked here, then described and run in a child process with
    a timeout, so a flatbuffer that crashes the interpreter ends the run with exit 2 naming the signal.
    Feeds in the contract's layout are fitted to the file's (`fit_layout`)."""

    check_header(Path(path))
    return IsolatedRunner("tflite", path, fit_layout=True, **options)


def io_note(details: dict) -> str:
    """'float32 inputs and outputs', or which tensors are quantised and how the runner bridges them."""
    q_in = [d for d in details["inputs"] if d["quantization"]]
    q_out = [d for d in details["outputs"] if d["quantization"]]
    if not q_in and not q_out:
        return "float32 inputs and outputs"
    kinds = sorted({d["tensor_dtype"] for d in q_in + q_out})
    return (f"{'/'.join(kinds)} I/O ({len(q_in)} input(s) quantised from float, {len(q_out)} output(s) dequantised "
            f"with each tensor's scale and zero point)")


def tflite_name(name: str) -> str:
    """'serving_default_input_1:0' -> 'input_1'; 'x:0' -> 'x'."""
    n = re.sub(r":\d+$", "", name)
    return re.sub(r"^serving_default_", "", n)


QUANTISED = (np.int8, np.uint8, np.int16)


def _scale_zero(detail: dict) -> tuple[float, int] | None:
    q = detail.get("quantization") or (0.0, 0)
    return (float(q[0]), int(q[1])) if q[0] else None


def quantise(x: np.ndarray, detail: dict) -> np.ndarray:
    """A float array in a quantised input's integer type, with the tensor's scale and zero point."""
    dtype = np.dtype(detail["dtype"])
    sz = _scale_zero(detail)
    if sz is None or dtype.type not in QUANTISED or not np.issubdtype(x.dtype, np.floating):
        return x.astype(dtype, copy=False)
    scale, zero = sz
    info = np.iinfo(dtype)
    return np.clip(np.round(x.astype(np.float64) / scale) + zero, info.min, info.max).astype(dtype)


def io_detail(d: dict) -> dict:
    """One tensor's details as plain JSON: the dtype callers feed/read, and the file's own dtype."""
    stored = np.dtype(d["dtype"]).name
    sz = _scale_zero(d)
    quantised = sz is not None and np.dtype(d["dtype"]).type in QUANTISED
    return {"name": d["name"], "index": int(d["index"]), "dtype": "float32" if quantised else stored,
            "tensor_dtype": stored, "quantization": list(sz) if quantised else None,
            "shape_signature": [int(x) for x in d.get("shape_signature", d["shape"])]}


class TFLiteRunner(Runner):
    name = "tflite"
    distribution = "ai-edge-litert"
    imports = ("ai_edge_litert",)  # a TFLite file's users have LiteRT

    @classmethod
    def frameworks(cls) -> tuple[str, ...]:
        """LiteRT; TensorFlow's interpreter where LiteRT is not installed here, as its users would run it."""
        import importlib.util

        return cls.imports if importlib.util.find_spec("ai_edge_litert") is not None else (*cls.imports, "tensorflow")

    @classmethod
    def open(cls, path, *, threads: int | None = None) -> TFLiteRunner:
        """A user's file in this process (a child would time the pipe): its identifier checked first."""
        check_header(Path(path))
        return cls(path, threads=threads, fit_layout=True)

    def __init__(self, model, *, threads: int | None = None, signature: str | None = None,
                 input_names: list[str] | None = None, output_names: list[str] | None = None,
                 input_transpose: dict[str, list[int]] | None = None, dequantize_outputs: bool = True,
                 fit_layout: bool = False):
        self.path = Path(model)
        self.threads = threads
        self.delegates = True
        self._load()
        self.signatures = self.interpreter.get_signature_list() or {}
        if signature is not None and signature not in self.signatures:
            raise BadInputError(f"the TFLite model has no signature '{signature}' (it has {sorted(self.signatures) or 'none'})",
                                path=self.path)
        self.signature = signature
        self.input_names = input_names  # our names, in the interpreter's input order
        self.output_names = output_names
        self.input_transpose = input_transpose or {}  # for a user's file fed another layout (`validate`)
        self.dequantize_outputs = dequantize_outputs  # False: int8/uint8 outputs as stored (a source's own values)
        self.fit_layout = fit_layout

    def _load(self) -> None:

        self.interpreter = load_interpreter(self.path, self.threads, delegates=self.delegates)
        with silenced_output():  # the first allocation logs the XNNPACK delegate at INFO level on stderr
            self.interpreter.allocate_tensors()
        self.inputs = self.interpreter.get_input_details()
        self.outputs = self.interpreter.get_output_details()

    def describe(self) -> dict:
        """Inputs and outputs in the interpreter's order (see `io_detail`)."""
        return {"inputs": [io_detail(d) for d in self.inputs], "outputs": [io_detail(d) for d in self.outputs]}

    def input_specs(self) -> list[TensorSpec]:
        """Inputs in the interpreter's order under the names a caller feeds them by (the signature's
        keys when it runs through one, else the stripped tensor names); dynamic dims symbolic ('dimK')."""
        keys = {}
        if self.signature is not None:
            keys = {int(d["index"]): k for k, d in self.interpreter.get_signature_runner(self.signature).get_input_details().items()}
        varying = self._varying("inputs")
        specs = []
        for d in self.describe()["inputs"]:
            name = keys.get(d["index"]) or tflite_name(d["name"])
            specs.append(TensorSpec(name, d["dtype"], [int(x) if x > 0 and k not in varying.get(name, ()) else f"dim{k}"
                                                       for k, x in enumerate(d["shape_signature"])]))
        return specs

    def _varying(self, kind: str) -> dict[str, set[int]]:
        """{tensor: axes} whose size differs between the signatures of a file with one signature per
        size (`emitters/tflite_sizes.py`): dims the file keeps at listed sizes."""
        if self.signature is None or len(self.signatures) < 2:
            return {}
        shapes: dict[str, set[tuple]] = {}
        for key in self.signatures:
            runner = self.interpreter.get_signature_runner(key)
            for name, d in (runner.get_input_details() if kind == "inputs" else runner.get_output_details()).items():
                shapes.setdefault(name, set()).add(tuple(int(x) for x in d["shape_signature"]))
        return {name: {k for k in range(len(next(iter(seen)))) if len({s[k] for s in seen}) > 1}
                for name, seen in shapes.items() if len({len(s) for s in seen}) == 1}

    def output_specs(self) -> list[TensorSpec]:
        """Outputs under the names a caller reads them by (the signature's keys when it runs through
        one), in the dtype it gets them in (dequantised: float32); dynamic dims symbolic ('dimK')."""
        if self.signature is not None:
            details = self.interpreter.get_signature_runner(self.signature).get_output_details().items()
        else:
            details = [(tflite_name(d["name"]), d) for d in self.outputs]
        specs, varying = [], self._varying("outputs")
        for name, d in details:
            quantised = _scale_zero(d) is not None and np.dtype(d["dtype"]).type in QUANTISED and self.dequantize_outputs
            shape = [int(x) for x in d.get("shape_signature", d["shape"])]
            specs.append(TensorSpec(name, "float32" if quantised else np.dtype(d["dtype"]).name,
                                    [x if x > 0 and k not in varying.get(name, ()) else f"dim{k}" for k, x in enumerate(shape)]))
        return specs

    def io_note(self) -> str:
        return io_note(self.describe())

    def _fit(self, feeds: dict[str, np.ndarray]) -> tuple[list[str], dict[str, list[int]]]:
        """Our names in the interpreter's input order, and the feeds to transpose channels-first ->
        channels-last because only that fits the input's shape signature."""
        details = [io_detail(d) for d in self.inputs]
        by_name = {tflite_name(d["name"]): d for d in details}
        ordered = [by_name[n] for n in feeds] if set(feeds) == set(by_name) else details
        transpose = {}
        for (name, arr), d in zip(feeds.items(), ordered, strict=False):
            sig = [int(x) for x in d["shape_signature"]]
            perm = [0, *range(2, arr.ndim), 1]
            if arr.ndim >= 3 and not _fits(sig, arr.shape) and _fits(sig, [arr.shape[i] for i in perm]):
                transpose[name] = perm
        order = {d["index"]: i for i, d in enumerate(details)}
        names = [None] * len(details)
        for name, d in zip(feeds, ordered, strict=False):
            names[order[d["index"]]] = name
        return names, transpose

    def _match_inputs(self, feeds: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """(our name, array) pairs in the interpreter's input order."""
        if self.input_names:
            return [(n, feeds[n]) for n in self.input_names]
        by_name = {tflite_name(d["name"]): i for i, d in enumerate(self.inputs)}
        if set(feeds) <= set(by_name) and len(feeds) == len(self.inputs):
            return sorted(feeds.items(), key=lambda kv: by_name[kv[0]])
        if len(feeds) != len(self.inputs):
            raise BadInputError(f"{len(feeds)} inputs given, the TFLite model takes {len(self.inputs)}", path=self.path)
        return list(feeds.items())

    def _signature_for(self, feeds: dict[str, np.ndarray]) -> str | None:
        if self.signature is not None:
            return self.signature if len(self.signatures) == 1 else self._sized(feeds) or self.signature
        if self.input_names or self.output_names or self.input_transpose or len(self.signatures) != 1:
            return None
        key, io = next(iter(self.signatures.items()))
        return key if set(io.get("inputs", [])) == set(feeds) else None

    def _sized(self, feeds: dict[str, np.ndarray]) -> str | None:
        """In a file with one signature per size (`emitters/tflite_sizes.py`), the signature whose
        input shapes take the feeds: the one asked for where it does, else the first that does."""
        for key in (self.signature, *self.signatures):
            details = self.interpreter.get_signature_runner(key).get_input_details()
            if set(details) == set(feeds) and all(_fits([int(x) for x in d["shape_signature"]], np.shape(feeds[n]))
                                                  for n, d in details.items()):
                return key
        return None

    def _dequantised(self, v: np.ndarray, d: dict) -> np.ndarray:
        sz = _scale_zero(d)
        if sz and self.dequantize_outputs and np.dtype(d["dtype"]).type in QUANTISED:
            return (v.astype(np.float32) - sz[1]) * sz[0]
        return v

    def _run_signature(self, key: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        runner = self.interpreter.get_signature_runner(key)
        details = runner.get_input_details()
        if set(feeds) != set(details):
            raise BadInputError(f"inputs {sorted(feeds)} given; the TFLite signature '{key}' takes {sorted(details)}",
                                path=self.path)
        self.interpreter.reset_all_variables()  # each run from the initial state, as a fresh interpreter
        got = runner(**{n: np.asarray(quantise(a, details[n]), order="C") for n, a in feeds.items()})
        out_details = runner.get_output_details()
        return {n: self._dequantised(np.asarray(v), out_details[n]) for n, v in got.items()}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One inference. A graph the interpreter cannot prepare for these feeds (typically a file
        whose signature says a dim is dynamic while a Reshape inside fixes it) is tried once more
        without XNNPack, which refuses some reshapes the builtin kernels take, then is exit 2 naming
        the inputs whose shapes differ from the file's, never an unexpected crash."""
        try:
            return self._run(feeds)
        except RuntimeError as e:
            first = e
        if self.delegates:
            self.delegates = False
            self._load()
            try:
                return self._run(feeds)
            except RuntimeError as e:
                first = e
        raise self._cannot_run(feeds, first)

    def _cannot_run(self, feeds: dict[str, np.ndarray], error: Exception) -> BadInputError:
        reason = " ".join(str(error).split())[:300] or type(error).__name__
        built = {tflite_name(d["name"]): [int(x) for x in d["shape"]] for d in self.inputs}
        for key in self.signatures:
            for name, d in self.interpreter.get_signature_runner(key).get_input_details().items():
                built.setdefault(name, [int(x) for x in d["shape"]])
        moved = [f"'{n}' at {list(np.shape(a))} (the file's graph is built for {built[n]})"
                 for n, a in feeds.items() if n in built and list(np.shape(a)) != built[n]]
        if moved:
            return BadInputError(f"the TFLite model cannot run input {', '.join(moved)}: {reason}", path=self.path,
                                 hint="its graph fixes a size its signature leaves dynamic; feed that size "
                                      "(--dim NAME=N or --data)")
        return BadInputError(f"the TFLite interpreter failed: {reason}", path=self.path)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.fit_layout:
            self.input_names, self.input_transpose = self._fit(feeds)
        key = self._signature_for(feeds)
        if key is not None:
            return self._run_signature(key, feeds)
        pairs = [(n, np.transpose(a, self.input_transpose[n]) if n in self.input_transpose else a)
                 for n, a in self._match_inputs(feeds)]
        it = self.interpreter
        for (_, a), d in zip(pairs, self.inputs, strict=True):
            if tuple(d["shape"]) != a.shape:
                it.resize_tensor_input(d["index"], list(a.shape), strict=False)
        it.allocate_tensors()
        for (_, a), d in zip(pairs, it.get_input_details(), strict=True):
            it.set_tensor(d["index"], np.asarray(quantise(a, d), order="C"))
        # variable tensors (an LSTM's state) keep their values between invokes: every run starts
        # from the initial state, as in a fresh interpreter and in the converted graph
        it.reset_all_variables()
        it.invoke()
        outs = {}
        details = it.get_output_details()
        names_out = self.output_names or [tflite_name(d["name"]) for d in details]
        if len(set(names_out)) < len(names_out):  # 'StatefulPartitionedCall:0', ':1' strip to one name
            names_out = [d["name"] for d in details]
        for name, d in zip(names_out, details, strict=True):
            outs[name] = self._dequantised(it.get_tensor(d["index"]), d)
        return outs


def _fits(sig, shape) -> bool:
    return len(sig) == len(shape) and all(s in (-1, x) for s, x in zip(sig, shape, strict=False))
