"""The intermediate representation: an ONNX model plus its I/O contract, provenance and references.

`IRModel` is what parsers produce, passes transform and emitters consume. The I/O contract
(`TensorSpec`: name, dtype, shape with named dynamic dims, layout, preprocessing) travels with the
model so that no later stage guesses a layout or a dynamic axis. Reference data are the source
framework's own outputs on deterministic sample inputs: every later stage is checked against them.

On disk an IR is a folder: `model.onnx` (+ `model.onnx.data` when large), `ir.json` and
`reference.npz`.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from modelport.dims import DimSpec
from modelport.errors import BadInputError
from modelport.onnxfile.contract_stamp import read_contract
from modelport.onnxfile.external_data_files import attach_external, write_external
from modelport.onnxfile.onnx_io import load_onnx, save_onnx
from modelport.onnxfile.tensor_sizes import tensor_bytes
from modelport.run.memory import give_back

Dim = int | str
PARK_BYTES = 64 << 20  # IRModel.weights_parked: models whose weights reach this size (writing and reading them back: well under a second)
LAYOUTS = ("NCHW", "NHWC", "NCW", "NWC", "NCDHW", "NDHWC", "NC", "NTC", "TNC", "NT", "SCALAR")

# ONNX TensorProto elem_type <-> numpy dtype name
ONNX_TO_NUMPY = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
}


@dataclass
class Preprocess:
    """What a client does to raw data before feeding the model: x' = (x * scale - mean) / std."""

    scale: float | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    channel_order: str | None = None  # "RGB" or "BGR"

    def is_empty(self) -> bool:
        return all(v is None for v in asdict(self).values())


@dataclass
class TensorSpec:
    name: str
    dtype: str = "float32"
    shape: list[Dim] = field(default_factory=list)
    layout: str | None = None
    preprocess: Preprocess | None = None
    value_range: list[float] | None = None  # [low, high) for sample data, e.g. token ids
    scalar: bool = False  # declared 0-d (`--input sr:scalar:int64`): an empty shape that is given, not missing

    @property
    def dynamic_dims(self) -> dict[int, str]:
        """Axis index -> symbolic name for every dynamic axis."""
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    def concrete_shape(self, dims: dict[str, int] | None = None, default: int = 2) -> tuple[int, ...]:
        """The shape with symbolic dims replaced by `dims[name]` or `default`."""
        dims = dims or {}
        return tuple(d if isinstance(d, int) else int(dims.get(d, default)) for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "layout": self.layout}
        out["preprocess"] = asdict(self.preprocess) if self.preprocess and not self.preprocess.is_empty() else None
        if self.value_range is not None:
            out["value_range"] = list(self.value_range)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        pre = d.get("preprocess")
        return cls(
            name=d["name"],
            dtype=d.get("dtype", "float32"),
            shape=list(d.get("shape", [])),
            layout=d.get("layout"),
            preprocess=Preprocess(**pre) if pre else None,
            value_range=d.get("value_range"),
        )


def guess_layout(shape: list[Dim]) -> str | None:
    """A conservative layout guess from rank and channel position, or None when unsure."""
    if len(shape) == 4:
        c1, c3 = shape[1], shape[3]
        if isinstance(c1, int) and c1 in (1, 3, 4) and not (isinstance(c3, int) and c3 in (1, 3, 4)):
            return "NCHW"
        if isinstance(c3, int) and c3 in (1, 3, 4) and not (isinstance(c1, int) and c1 in (1, 3, 4)):
            return "NHWC"
    if len(shape) == 2:
        return "NC"
    return None


def specs_from_onnx(values) -> list[TensorSpec]:
    """TensorSpecs from ONNX ValueInfoProtos (graph inputs or outputs)."""
    specs = []
    for v in values:
        tt = v.type.tensor_type
        shape: list[Dim] = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                shape.append(int(d.dim_value))
            else:  # a negative size (Paddle writes -1) and an anonymous "?" are dynamic dims of their own
                shape.append(d.dim_param if d.dim_param not in ("", "?") else f"{v.name}_dim{i}")
        specs.append(TensorSpec(name=v.name, dtype=ONNX_TO_NUMPY.get(tt.elem_type, "float32"), shape=shape))
    return specs


def contract_from_onnx(model) -> tuple[list[TensorSpec], list[TensorSpec], dict[str, int]]:
    """(inputs, outputs, sample dims) of an ONNX model: its graph inputs (initializers excluded) and
    outputs, with what a modelport-written file keeps beside the graph (`contract_stamp.stamped_contract`):
    layouts, preprocessing and value ranges, and the sample dims of its references."""

    init = {i.name for i in model.graph.initializer}
    inputs = specs_from_onnx([v for v in model.graph.input if v.name not in init])
    outputs = specs_from_onnx(model.graph.output)
    stored = read_contract(model) or {}
    for specs, key in ((inputs, "inputs"), (outputs, "outputs")):
        saved = {d["name"]: TensorSpec.from_dict(d) for d in stored.get(key) or [] if isinstance(d, dict) and d.get("name")}
        for s in specs:
            if s.name in saved:
                s.layout, s.preprocess, s.value_range = saved[s.name].layout, saved[s.name].preprocess, saved[s.name].value_range
    return inputs, outputs, dict(stored.get("sample_dims") or {})


@dataclass
class Sample:
    """One sample set beyond the reference's first: its kind ("random-2", "zeros", "constant",
    "low", "high", "data-2", …), the inputs and the source framework's outputs on them."""

    kind: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    # the source's outputs with the float inputs moved one ulp (`samples.nudge`): how far its own
    # answer moves there, the set's conditioning (`validation/compare.py`); None: not measured
    nudged: dict[str, np.ndarray] | None = None


@dataclass
class Reference:
    """Deterministic sample inputs and the source framework's outputs on them.

    `inputs`/`outputs` are the first sample set (kind `first_kind`: "random", or "data" when the
    user's `--data` pinned every input); `extra` holds the other sample sets every hop is judged
    on too (`sample_sets.py` says which): other seeds and scales, and structured inputs (all-zeros,
    a constant, the extremes of the input's range, constant frames at full-mantissa values) that
    random data never reach."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    producer: str = ""  # e.g. "torch 2.13.0"
    extra: list[Sample] = field(default_factory=list)
    first_kind: str = "random"
    # inputs whose sample values are a guess (`input_roles.guessed_inputs`): a failure names them
    guessed: list[str] = field(default_factory=list)

    def sets(self) -> list[Sample]:
        """Every sample set, the first one first."""
        return [Sample(self.first_kind, self.inputs, self.outputs), *self.extra]

    def kinds(self) -> list[str]:
        return [s.kind for s in self.sets()]

    def without(self, *kinds: str) -> Reference:
        """The same reference less the extra sets of these kinds."""
        return Reference(self.inputs, self.outputs, self.producer, [s for s in self.extra if s.kind not in kinds],
                         self.first_kind, list(self.guessed))

    def save(self, path: Path) -> None:
        arrays = {f"in/{k}": v for k, v in self.inputs.items()}
        arrays.update({f"out/{k}": v for k, v in self.outputs.items()})
        for i, sample in enumerate(self.extra, start=1):
            arrays.update({f"s{i}/in/{k}": v for k, v in sample.inputs.items()})
            arrays.update({f"s{i}/out/{k}": v for k, v in sample.outputs.items()})
            arrays.update({f"s{i}/nudged/{k}": v for k, v in (sample.nudged or {}).items()})
        arrays["kinds"] = np.asarray(self.kinds())
        if self.guessed:
            arrays["guessed"] = np.asarray(self.guessed)
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path, producer: str = "") -> Reference:
        with np.load(path, allow_pickle=False) as z:
            def part(prefix: str) -> dict[str, np.ndarray]:
                return {k[len(prefix):]: z[k] for k in z.files if k.startswith(prefix)}

            kinds = [str(k) for k in z["kinds"]] if "kinds" in z.files else ["random"]
            extra = [Sample(kind, part(f"s{i}/in/"), part(f"s{i}/out/"), part(f"s{i}/nudged/") or None)
                     for i, kind in enumerate(kinds[1:], start=1)]
            guessed = [str(n) for n in z["guessed"]] if "guessed" in z.files else []
            return cls(part("in/"), part("out/"), producer, extra, kinds[0], guessed)


@dataclass
class SourceRef:
    """The source an IR was parsed from, for the targets a source framework converts itself (the
    native routes, `emitters/routes.py`): `kind` is the parser's name (keras, savedmodel, pytorch, …),
    `source` the path, 'zoo:NAME' or object the parser read, `spec` its SourceSpec. Held in memory
    only: an IR saved to a folder does not carry it."""

    kind: str
    source: Any
    spec: Any


class Provenance(TypedDict, total=False):
    """`IRModel.provenance`: how the IR was made, as the parsers and the optimisation stage record it
    (saved in ir.json; the report's `source` repeats some keys, `orchestration/source.py` SOURCE_DETAILS).
    A plain dict at run time; each key is written by the code named in its comment."""

    # every parser
    framework: str  # the source's framework: the parser's name (onnx, pytorch, keras, tensorflow, tflite, caffe, darknet, paddle, huggingface; transformers for a written decoder)
    format: str  # the source's format in words ("onnx", "savedmodel", "graphdef", "darknet cfg + weights", …)
    path: str  # the source file or folder (or 'zoo:NAME', or the class name of an in-memory model)
    opset: int | None  # the default-domain ONNX opset of the IR's graph (emitters/preflight.py: the one it was converted to)
    reference_varies: dict[str, bool | None]  # output -> whether the source's reference changed between two sample inputs (None: not decided)
    samples_skipped: list[str] | None  # "kind: reason" of each extra sample set the source itself failed on
    warnings: list[str]  # what the parser chose for the user (a checkpoint entry, sample sizes, a quantised source): the convert stage warns with them
    # how the ONNX graph was made or read
    exporter: str  # the exporter that wrote the ONNX graph (a torch.onnx route, "tf2onnx X", "paddle2onnx X", the decoder writer)
    producer: str  # the ONNX file's producer name and version (onnx), "darknet"
    ir_version_note: str | None  # what lowering the file's ONNX IR version to onnxruntime's did (onnxfile/ir_version_fit.py), None: unchanged
    # PyTorch (parsers/pytorch.py)
    exporter_fallback_reason: str | None  # why the first export route failed, when a later one worked
    export_attempts: list[dict[str, Any]]  # each export route tried: route, ok, reason, seconds (the parse stage row's `attempts`)
    fixed_dims: dict[str, int] | None  # dynamic dims the export route could only trace at their sample size: dim -> size
    saved_on: list[str] | None  # the devices the file was saved on (read and converted on the CPU)
    arch: str  # --arch: the architecture a state dict was loaded into
    arch_args: dict[str, Any]  # --arch-args: the keyword arguments its constructor was given
    state_dict_key: str  # the checkpoint entry the weights were read from ('a' or 'a.b')
    state_dict_prefix_removed: str  # the prefix removed from the checkpoint's keys (module. from DataParallel)
    state_dict_prefix_added: str  # the prefix added to the checkpoint's keys (the one --arch holds the network under)
    state_dict_keys_left_out: list[str]  # the checkpoint's keys outside the one prefix that was taken
    # framework-specific
    weights: str  # the weights file read beside the graph (darknet .weights, caffemodel, Paddle params)
    weights_version: str  # darknet: the weights file's major.minor.revision
    seen: int  # darknet: the images the network saw in training, from the weights header
    layers: int  # darknet: the cfg's sections; caffe: the net's inference layers
    net: str | None  # caffe: the net's name in the prototxt
    model_name: str | None  # keras: the model's name
    tensorflow: str  # the TensorFlow version that read the source (keras, savedmodel, graphdef, tflite)
    paddle: str  # the Paddle version that ran the source
    signature: str  # savedmodel: the signature converted
    signatures: list[str]  # savedmodel, tflite: every signature the file holds
    source_precision: str  # the precision the source computes at where not fp32 (tflite: int8-dynamic-range)
    # Hugging Face (parsers/huggingface.py, parsers/hf_decoder.py)
    task: str  # the task the folder was exported for
    architecture: str  # the config's first architecture class
    companion_files: list[str]  # the tokenizer/preprocessor files the convert stage copies next to the artifacts
    decoder: dict[str, Any]  # a KV-cache decoder's configuration (parsers/hf_decoder_config.py DecoderConfig.to_dict)
    # the optimisation stage (optimize/, orchestration/text_generation.py)
    precision: str  # the precision the IR's weights were converted to (fp16, int8, a text-generation variant's)
    fp16: dict[str, Any]  # the FP16 conversion: nodes kept in fp32, overflow, rounds, parity (optimize/precision.py)
    int8: dict[str, Any]  # the INT8 quantisation: mode, nodes kept in float, calibration, parity (optimize/quantize.py)
    precision_fallback: dict[str, str]  # {requested, reason}: the precision asked that could not hold parity, delivered fp32


@dataclass
class IRModel:
    model: Any  # onnx.ModelProto
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    provenance: Provenance = field(default_factory=Provenance)
    reference: Reference | None = None
    sample_dims: dict[str, int] = field(default_factory=dict)
    # the dims declared a range or a list of sizes (`--dim batch=1..8`): {name: dims.DimSpec}
    dim_bounds: dict[str, Any] = field(default_factory=dict)
    # A source exported as several models (a seq2seq encoder and decoder): one full IR per part,
    # converted and validated one by one into OUT/<part>/; this IR then has no model of its own.
    parts: dict[str, IRModel] = field(default_factory=dict)
    source: SourceRef | None = None  # set by the convert pipeline after parsing
    # the folder of the data file the model's large initializers still refer to (a parse given
    # SourceSpec.weights_dir); None once the model holds them (`attach_stored`)
    stored: Path | None = None

    def input(self, name: str) -> TensorSpec:
        for s in self.inputs:
            if s.name == name:
                return s
        raise BadInputError(f"unknown input '{name}'; the model's inputs are {[s.name for s in self.inputs]}")

    def clone(self, model=None) -> IRModel:
        """A copy sharing the reference data (read-only by contract) with a new or copied model."""
        if model is None:
            from onnx import ModelProto

            model = ModelProto()
            model.CopyFrom(self.model)
        return IRModel(
            model=model,
            inputs=copy.deepcopy(self.inputs),
            outputs=copy.deepcopy(self.outputs),
            provenance=copy.deepcopy(self.provenance),
            reference=self.reference,
            sample_dims=dict(self.sample_dims),
            dim_bounds=dict(self.dim_bounds),
            source=self.source,
        )

    def contract(self) -> dict[str, Any]:
        return {
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "sample_dims": self.sample_dims,
            **({"dims": {d: b.to_dict() for d, b in self.dim_bounds.items()}} if self.dim_bounds else {}),
        }

    def attach_stored(self) -> IRModel:
        """Read the weights a parse left in files into the model (tensor by tensor; this IR's and its
        parts'); the files can go afterwards."""

        for ir in (self, *self.parts.values()):
            if ir.stored is not None:
                attach_external(ir.model, ir.stored)
                ir.stored = None
        return self

    def park(self, folder: Path, name: str) -> Path:
        """Move the model's weights into `folder` and keep its graph alone: `folder/name` is the model,
        `name`.data beside it the bytes of its large initializers that were in memory (those already
        stored in `folder` keep their place); `self.stored` is then `folder` (`attach_stored` reads them
        back). Returns the model's file, which a runtime can load. Writes tensor by tensor; the old
        message is let go (see `weights_parked`)."""
        import onnx


        if self.stored is not None and Path(self.stored) != Path(folder):
            raise ValueError(f"the model's weights are stored in {self.stored}, not in {folder}")
        path = Path(folder) / name
        write_external(self.model, path, name + ".data")
        self.model = onnx.load(str(path), load_external_data=False)
        self.stored = Path(folder)
        give_back()
        return path

    @contextlib.contextmanager
    def weights_parked(self):
        """While the block runs, the model's weights wait in a scratch file instead of memory, and
        `self.model` is its graph alone (initializers referring to that file); afterwards they are
        read back, tensor by tensor. For a child process that needs memory while this one needs
        nothing but the contract and the references (validation of an artifact by its runtime): the
        weights are not held twice over the process tree. Models under PARK_BYTES stay as they are. Gives the parked model's file (its weights in a data file beside it, each tensor
        page-aligned: a runtime may load it from there), or None when nothing was parked.

        With the upb protobuf runtime a ModelProto's bytes are freed only with the whole message, so
        the graph is a new message and the old one is let go; memory is only given back when nothing
        else holds it."""
        import tempfile


        if self.model is None or self.stored is not None or tensor_bytes(self.model) < PARK_BYTES:
            yield None  # a model whose weights are in files already (`park`) holds nothing to move
            return
        with tempfile.TemporaryDirectory(prefix="modelport-parked-") as tmp:
            path = self.park(Path(tmp), "model.onnx")
            try:
                yield path
            finally:
                self.attach_stored()

    def save(self, folder: str | Path, *, model_name: str = "model.onnx") -> list[Path]:
        """Write the IR into `folder`; returns the files written."""

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        files = save_onnx(self.model, folder / model_name)
        meta = {"provenance": self.provenance, **self.contract()}
        (folder / "ir.json").write_text(json.dumps(meta, indent=2, default=str))
        files.append(folder / "ir.json")
        if self.reference is not None:
            self.reference.save(folder / "reference.npz")
            files.append(folder / "reference.npz")
        return files

    @classmethod
    def load(cls, folder: str | Path, *, model_name: str = "model.onnx") -> IRModel:

        folder = Path(folder)
        meta = json.loads((folder / "ir.json").read_text())
        ref_path = folder / "reference.npz"
        return cls(
            model=load_onnx(folder / model_name),
            inputs=[TensorSpec.from_dict(d) for d in meta["inputs"]],
            outputs=[TensorSpec.from_dict(d) for d in meta["outputs"]],
            provenance=meta.get("provenance", {}),
            reference=Reference.load(ref_path) if ref_path.exists() else None,
            sample_dims=meta.get("sample_dims", {}),
            dim_bounds=_dim_bounds(meta.get("dims")),
        )


def _dim_bounds(stored: dict | None) -> dict:
    """The `dims` of a saved contract as {name: dims.DimSpec}."""
    if not stored:
        return {}

    return {name: DimSpec.from_dict(d) for name, d in stored.items()}
