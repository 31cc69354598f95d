"""Darknet (YOLO) sources: a `.cfg` network and its `.weights`, translated to ONNX by modelport itself
(darknet_layers.py) and checked against OpenCV DNN, which reads both files as darknet does.

The cfg is read as data: INI-like sections, [net] first, `key=value` lines; a key that names a
file (darknet's `tree`, `map`, `weights_file`, ...) or a value holding a path separator is refused,
and so is a file or line count past the caps below. The weights file is a header (int32 major,
minor, revision, then `seen`: int64 from version 0.2 on, else int32) and float32 tensors in cfg
order: per [convolutional] or [connected] its biases, then (batch_normalize=1) scales, rolling
mean and rolling variance, then its weights. A file that runs short is an error naming the layer
and the tensor; bytes left over after the last layer are a warning (darknet and OpenCV ignore
them too, but they usually mean the cfg and the weights are not a pair).

The contract: one input `data` (OpenCV's name for a darknet net's input) [batch, C, H, W] from
[net], float32 in [0, 1], NCHW; one output per [yolo] layer named as OpenCV names it (`yolo_16`),
[batch, cells × anchors, 5 + classes] (OpenCV gives the rows without the batch axis when the
batch is 1; the reference takes the axis back), or else the net's last layers under OpenCV's
names.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, UnsafeInputError
from modelport.ir import IRModel, Reference, TensorSpec
from modelport.parsers.contract import merge_specs
from modelport.parsers.darknet_layers import TRANSLATIONS, Blob, Graph, Section, activation, weights_needed
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import sample_reference
from modelport.run.file_checks import companion_file
from modelport.runtimes.opencv_dnn import OpenCVRunner, load_net

NAME = "darknet"
DESCRIPTION = "Darknet / YOLO network (.cfg) and weights (.weights)"

OPSET = 17
MAX_CFG_BYTES = 1 << 20  # darknet's largest cfgs are about 30 KB
MAX_CFG_LINES = 50_000
MAX_SECTIONS = 5_000
NET_SECTIONS = ("net", "network")
# keys with which darknet reads another file (a label tree, a class map, pretrained weights, data lists)
FILE_KEYS = frozenset({"file", "weights_file", "tree", "map", "labels", "names", "train", "valid", "backup", "data",
                       "cfg", "weights", "path"})
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# options OpenCV ignores although darknet computes with them: refused rather than translated wrongly
IGNORED_BY_OPENCV = {"convolutional": {"dilation": "1", "binary": "0", "xnor": "0", "antialiasing": "0",
                                       "deform": "0", "share_index": None, "stride_x": None, "stride_y": None},
                     "maxpool": {"maxpool_depth": "0", "stride_x": None, "stride_y": None, "antialiasing": "0"}}


def sniff(path: Path) -> bool:
    if not (path.is_file() and path.suffix.lower() == ".cfg"):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    for line in head.splitlines():
        line = line.strip()
        if line and line[0] not in "#;":
            return line.replace(" ", "").lower() in ("[net]", "[network]")
    return False


def read_cfg(path: Path) -> tuple[dict[str, str], list[Section]]:
    """The [net] options and the layer sections of a cfg file, refusing what names or pulls in a file."""
    size = path.stat().st_size
    if size > MAX_CFG_BYTES:
        raise BadInputError(f"{size} bytes is past the {MAX_CFG_BYTES}-byte cap on a darknet cfg", path=path)
    raw = path.read_bytes()
    if b"\0" in raw:
        raise BadInputError("a darknet cfg is text; this file holds NUL bytes", path=path)
    lines = raw.decode("utf-8", "replace").splitlines()
    if len(lines) > MAX_CFG_LINES:
        raise BadInputError(f"{len(lines)} lines is past the {MAX_CFG_LINES}-line cap on a darknet cfg", path=path)
    net: dict[str, str] | None = None
    sections: list[Section] = []
    current: dict[str, str] | None = None
    where = ""
    for number, text in enumerate(lines, 1):
        line = text.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            kind = line.replace(" ", "")[1:].split("]", 1)[0].lower() if "]" in line else ""
            if not KEY.fullmatch(kind):
                raise BadInputError(f"line {number}: '{line[:60]}' is not a section header", path=path)
            if kind in NET_SECTIONS:
                if net is not None or sections:
                    raise BadInputError(f"line {number}: a second [{kind}] section (it must come once, first)", path=path)
                net = current = {}
                where = f"[{kind}]"
                continue
            if net is None:
                raise BadInputError(f"line {number}: [{kind}] before [net] (a darknet cfg starts with [net])", path=path)
            if len(sections) >= MAX_SECTIONS:
                raise BadInputError(f"more than {MAX_SECTIONS} sections", path=path)
            sections.append(Section(len(sections), kind, {}, number))
            current, where = sections[-1].options, sections[-1].where
            continue
        if current is None:
            raise BadInputError(f"line {number}: '{line[:60]}' comes before any section", path=path)
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not KEY.fullmatch(key):
            raise BadInputError(f"line {number} ({where}): '{line[:60]}' is not a key=value option", path=path)
        if key.lower() in FILE_KEYS:
            raise UnsafeInputError(f"line {number} ({where}): option '{key}' names a file; a cfg that refers to other "
                                "files is refused", path=path)
        if "/" in value or "\\" in value or ":" in value or "~" in value:
            raise UnsafeInputError(f"line {number} ({where}): '{key}={value[:60]}' looks like a path where a number or "
                                "a word is expected; refused", path=path)
        current[key] = value
    if net is None:
        raise BadInputError("no [net] section: not a darknet cfg", path=path)
    if not sections:
        raise BadInputError("a [net] section and no layers", path=path)
    return net, sections


def check_translatable(sections: list[Section], path: Path) -> None:
    """Every section untranslated (all of them named at once), or an option darknet computes with
    that OpenCV ignores."""
    missing = [s.where for s in sections if s.kind not in TRANSLATIONS]
    if missing:
        raise BadInputError(f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no translation "
                            f"(translated: {', '.join(sorted(TRANSLATIONS))})", path=path)
    for s in sections:
        for key, default in IGNORED_BY_OPENCV.get(s.kind, {}).items():
            if key in s.options and (default is None or s.options[key] != default):
                if key in ("stride_x", "stride_y") and s.options[key] == s.options.get("stride", "1" if s.kind != "maxpool" else "2"):
                    continue
                raise BadInputError(f"{s.where}: option {key}={s.options[key]} has no translation", path=path)


class WeightsReader:
    """The float32 tensors of a darknet weights file, read in order, each checked against what is left."""

    def __init__(self, path: Path):
        self.path = path
        data = path.read_bytes()
        if len(data) < 16:
            raise BadInputError(f"{len(data)} bytes: too short for a darknet weights header", path=path)
        major, minor, revision = struct.unpack_from("<3i", data, 0)
        if major > 1000 or minor > 1000 or major < 0 or minor < 0:
            raise BadInputError(f"weights version {major}.{minor}: transposed (or not darknet) weights have no "
                                "translation", path=path)
        wide = major * 10 + minor >= 2
        self.seen = struct.unpack_from("<q" if wide else "<i", data, 12)[0]
        self.version = f"{major}.{minor}.{revision}"
        start = 20 if wide else 16
        if (len(data) - start) % 4:
            raise BadInputError(f"{len(data) - start} bytes after the header is not a whole number of float32 values",
                                path=path)
        self.values = np.frombuffer(data, dtype="<f4", offset=start).astype(np.float32)
        self.offset = 0

    def take(self, section: Section, what: str, count: int) -> np.ndarray:
        left = len(self.values) - self.offset
        if count > left:
            raise BadInputError(f"{section.where} {what}: {count} floats expected, {left} left (the weights file is "
                                "truncated or is not this cfg's)", path=self.path)
        out = self.values[self.offset: self.offset + count]
        self.offset += count
        return out

    @property
    def left(self) -> int:
        return len(self.values) - self.offset


def translate(net: dict[str, str], sections: list[Section], weights: WeightsReader, path: Path):
    """(ONNX graph, input blob, layer blobs, the unconnected layers' indices) for the cfg and weights."""
    try:
        dims = [int(net.get(k, d)) for k, d in (("channels", 3), ("height", 416), ("width", 416))]
    except ValueError:
        raise BadInputError(f"[net] width/height/channels must be integers: {net}", path=path) from None
    if min(dims) <= 0 or max(dims) > 16384:
        raise BadInputError(f"[net] channels, height, width {dims} are not an image size", path=path)
    image = Blob("data", tuple(dims))
    g = Graph()
    consumed: set[int] = set()
    for s in sections:
        src_shape = g.layers[-1].shape if g.layers else image.shape
        blobs = {what: weights.take(s, what, n) for what, n in weights_needed(s, src_shape)}
        try:
            g.layers.append(activation(g, s, TRANSLATIONS[s.kind](g, s, image, blobs)))
        except BadInputError as e:
            raise BadInputError(e.reason, path=path) from None
        if s.kind == "route":
            consumed.update(r + s.index if r < 0 else r for r in s.numbers("layers"))
        else:
            consumed.add(s.index - 1)
            if s.kind == "shortcut":
                consumed.add(s.integer("from") + s.index if s.integer("from") < 0 else s.integer("from"))
    ends = [i for i in range(len(sections)) if i not in consumed]
    return g, image, ends


def build_model(g: Graph, image: Blob, outputs: list[tuple[str, Blob]], batch):
    import onnx
    from onnx import TensorProto, helper

    for name, blob in outputs:
        g.nodes.append(helper.make_node("Identity", [blob.name], [name], name=f"{name}/output"))
    graph = helper.make_graph(
        g.nodes, "darknet",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [batch, *image.shape])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, *blob.shape]) for name, blob in outputs],
        initializer=g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelport")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def batched(run, outputs: list[tuple[str, Blob]]):
    """OpenCV's run with each output given its batch axis back (a [yolo] output at batch 1 has none)."""
    tails = {name: blob.shape for name, blob in outputs}

    def call(feeds):
        batch = int(np.shape(feeds["data"])[0])
        return {k: np.asarray(v).reshape(batch, *tails[k]) for k, v in run(feeds).items()}

    return call


def parse(source, spec) -> IRModel:

    path = Path(source)
    net_options, sections = read_cfg(path)
    check_translatable(sections, path)
    weights_path = companion_file(path, ".weights", what="darknet weights (.weights)", given=spec.options.get("weights"),
                                  hint=f"pass -in {path.name} -iw WEIGHTS")
    reader = WeightsReader(weights_path)
    channels, height, width = (int(net_options.get(k, d)) if net_options.get(k, str(d)).isdigit() else d
                               for k, d in (("channels", 3), ("height", 416), ("width", 416)))
    inputs = merge_specs([TensorSpec("data", "float32", ["batch", channels, height, width], "NCHW", value_range=[0.0, 1.0])],
                         spec.inputs, fixed=True)
    batch = inputs[0].shape[0]
    g, image, ends = translate(net_options, sections, reader, path)
    warnings = []
    if reader.left:
        warnings.append(f"{weights_path.name}: {reader.left} float32 values left after the last layer (OpenCV ignores "
                        "them too; the cfg and the weights may not be a pair)")

    cv2 = require("cv2", purpose="Darknet sources (OpenCV DNN is their reference runtime)")
    cv_net = load_net("darknet", path, weights_path)
    cv_names = list(cv_net.getUnconnectedOutLayersNames())
    if len(cv_names) != len(ends):
        raise BadInputError(f"OpenCV reads {len(cv_names)} output layers {cv_names}, the cfg has {len(ends)} unconnected "
                            f"layers {ends}", path=path)
    outputs = list(zip(cv_names, (g.layers[i] for i in ends), strict=True))
    for name, i in zip(cv_names, ends, strict=True):
        if sections[i].kind == "yolo" and name != f"yolo_{i}":
            raise BadInputError(f"OpenCV names the output of {sections[i].where} '{name}', not 'yolo_{i}'", path=path)
    if spec.output_names:
        if len(spec.output_names) != len(outputs):
            raise BadInputError(f"--output names {spec.output_names} do not match the model's {len(outputs)} outputs "
                                f"{cv_names}", path=path)
    model = build_model(g, image, outputs, batch)
    out_specs = [TensorSpec(name, "float32", [batch, *blob.shape]) for name, blob in outputs]

    runner = OpenCVRunner(cv_net, inputs, cv_names)
    run = batched(runner.run, outputs)
    sampled = sample_reference(run, inputs, spec.sample_dims, seed=spec.seed, given=spec.given, path=path)
    sample, ref_out, spec.sample_dims = sampled.feeds, sampled.outputs, sampled.dims
    varies, extra, skipped = reference_samples(run, inputs, sample, ref_out, spec.sample_dims, seed=spec.seed,
                                               given=spec.given, path=path, **spec.sampling)
    warnings += [n for n in (sampled.note,) if n]
    return IRModel(
        model=model,
        inputs=inputs,
        outputs=out_specs,
        provenance={"framework": "darknet", "format": "darknet cfg + weights", "path": str(path),
                    "weights": str(weights_path), "weights_version": reader.version, "seen": int(reader.seen),
                    "opset": OPSET, "layers": len(sections), "producer": "darknet",
                    "reference_varies": varies, "samples_skipped": skipped or None,
                    **({"warnings": warnings} if warnings else {})},
        reference=Reference(sample, ref_out, producer=f"opencv {cv2.__version__}", extra=extra),
        sample_dims=dict(spec.sample_dims),
    )


def inspect(path: Path) -> dict:
    """The cfg's input, layer histogram and [yolo] heads, read without the weights or OpenCV."""
    from collections import Counter

    net, sections = read_cfg(Path(path))
    dims = [net.get(k, d) for k, d in (("channels", "3"), ("height", "416"), ("width", "416"))]
    heads = [s for s in sections if s.kind == "yolo"]
    return {
        "format": "darknet cfg",
        "inputs": [{"name": "data", "dtype": "float32", "shape": ["batch", *[int(d) if d.isdigit() else d for d in dims]]}],
        "outputs": [{"name": f"yolo_{s.index}", "classes": s.options.get("classes")} for s in heads],
        "layers": len(sections),
        "ops": dict(Counter(s.kind for s in sections).most_common()),
        "size": Path(path).stat().st_size,
    }
