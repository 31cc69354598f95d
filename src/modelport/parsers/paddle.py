"""PaddlePaddle inference models as sources: `inference.json` (PIR, what `paddle.jit.save` writes in
Paddle 3) or a legacy `.pdmodel` (ProgramDesc protobuf), with their weights in a `.pdiparams` file,
converted with paddle2onnx and referenced by Paddle Inference.

Paddle and TensorFlow in one process crash (a segfault at Paddle's import once TensorFlow is
loaded), and paddle2onnx aborts the process on an op it cannot convert, so everything that imports
Paddle runs in one child process (`runtimes.isolated.call_in_child`, see `paddle_child.py`): the
program's read, the op screen, the Paddle Inference reference runs, paddle2onnx's export and the IR
assembly. This module, which the CLI imports, reads no more than names and first bytes: the
sniffing, where the weights are, and the refusal of pickled checkpoints.

Nothing here runs Python from a model file: the program is JSON or protobuf, read by Paddle's C++
deserialisers, and `.pdiparams` is Paddle's raw tensor stream, read by its C++ loader. A `.pdparams`
training checkpoint (`paddle.save`) is a pickle: refused, `--trust` included. The weights are walked
here tensor by tensor (`check_params`) before any loader sees them, so a truncated or foreign file is
named with the tensor where it breaks instead of an invalid ONNX model (paddle2onnx drops a tensor it
cannot read and carries on).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from modelport.errors import BadInputError, UnsafeInputError
from modelport.ir import IRModel
from modelport.onnxfile.proto_pieces import read_varint
from modelport.parsers.tf_common import spec_to_dict
from modelport.run.file_checks import check_model_file, companion_file
from modelport.runtimes.isolated import CONVERT_TIMEOUT_S, RUN_TIMEOUT_S, call_in_child, timeout_for

NAME = "paddle"
DESCRIPTION = "PaddlePaddle inference model (inference.json or .pdmodel + .pdiparams), run in a child process"
WEIGHTS_SUFFIX = ".pdiparams"
CHECKPOINT_SUFFIX = ".pdparams"
SNIFF_BYTES = 4096
# what paddle's PIR serialiser writes first: {"base_code":{"magic":"pir",...},"program":{...}}
_PIR_MARKER = re.compile(rb'"base_code"\s*:\s*\{[^{}]*"magic"\s*:\s*"pir"')
WHAT = "the Paddle conversion"


def sniff(path: Path) -> bool:
    path = Path(path)
    if not path.is_file():
        return False
    suffix = path.suffix.lower()
    if suffix == ".pdmodel":
        return True
    return suffix == ".json" and is_pir_json(path)


def is_pir_json(path: Path) -> bool:
    """Whether a .json file is a Paddle PIR program (not a Keras architecture or a Hugging Face config)."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return False
    return bool(_PIR_MARKER.search(head))


def is_pickle(path: Path) -> bool:
    """Whether the file starts as a pickle does (protocol 2 or later: PROTO opcode 0x80, then 2..5)."""
    with open(path, "rb") as f:
        head = f.read(2)
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def refuse_checkpoint(path: Path) -> None:
    if path.suffix.lower() == CHECKPOINT_SUFFIX or is_pickle(path):
        raise UnsafeInputError("the weights file is a pickle (a training checkpoint from paddle.save), not Paddle "
                            "inference weights (.pdiparams); modelport does not unpickle Paddle checkpoints, "
                            "--trust included", path=path,
                            hint="export the model with paddle.jit.save, which writes the program and a .pdiparams file")


def locate_weights(model: Path, spec) -> Path:
    """The `.pdiparams` file of a program: `-iw` (spec.options["weights"]), else beside it with the
    same stem, else the only `.pdiparams` file in its folder. A pickled checkpoint is refused."""

    weights = companion_file(model, WEIGHTS_SUFFIX, what="Paddle weights (.pdiparams)", given=spec.options.get("weights"),
                             hint="pass the weights file with -iw WEIGHTS.pdiparams")
    refuse_checkpoint(weights)
    return weights


# Paddle's VarType codes (framework.proto) -> (numpy dtype name, bytes per element)
PARAM_DTYPES = {0: ("bool", 1), 1: ("int16", 2), 2: ("int32", 4), 3: ("int64", 8), 4: ("float16", 2), 5: ("float32", 4),
                6: ("float64", 8), 19: ("uint64", 8), 20: ("uint8", 1), 21: ("int8", 1), 22: ("bfloat16", 2),
                23: ("complex64", 8), 24: ("complex128", 16), 32: ("float8_e4m3fn", 1), 33: ("float8_e5m2", 1),
                36: ("uint16", 2), 37: ("uint32", 4), 38: ("uint64", 8)}


def _tensor_desc(buf: bytes) -> tuple[int, list[int]]:
    """(data type, dims) of a serialised `VarType.TensorDesc` (data_type = 1, repeated int64 dims = 2)."""
    dtype, dims, i = None, [], 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(buf, i)
            if field == 1:
                dtype = value
            elif field == 2:
                dims.append(value - (1 << 64) if value >= 1 << 63 else value)
        elif wire == 2:
            size, i = read_varint(buf, i)
            end = i + size
            if end > len(buf):
                raise ValueError("a truncated field")
            if field == 2:
                while i < end:
                    value, i = read_varint(buf, i)
                    dims.append(value - (1 << 64) if value >= 1 << 63 else value)
            i = end
        else:
            raise ValueError(f"wire type {wire}")
    if dtype is None:
        raise ValueError("no data type")
    return dtype, dims


def check_params(path: Path, params: list[tuple[str, list[int] | None]]) -> int:
    """Walk a `.pdiparams` file against the program's persistable tensors (name, shape; Paddle writes
    them sorted by name) and return the bytes read; a file that ends inside a tensor, holds another
    model's tensors or more than the program's is a BadInputError naming the tensor. Pure Python:
    nothing else reads the file before this passes. Each tensor is: uint32 version, uint64 LoD level
    (+ its levels), uint32 version, int32 desc size, the TensorDesc protobuf, the raw data."""
    size = path.stat().st_size
    ordered = sorted(params, key=lambda p: p[0])
    pos = 0
    with open(path, "rb") as f:
        for k, (name, shape) in enumerate(ordered, start=1):
            where = f"tensor '{name}' ({k} of {len(ordered)})"

            def read(n: int, what: str, where=where) -> bytes:
                nonlocal pos
                data = f.read(n)
                if len(data) != n:
                    raise BadInputError(f"truncated weights: the file ends inside {where} ({what}: {len(data)} of {n} bytes "
                                        f"at offset {pos})", path=path)
                pos += n
                return data

            (version,) = struct.unpack("<I", read(4, "version"))
            if version != 0:
                raise BadInputError(f"not Paddle inference weights: {where} has version {version} at offset {pos - 4}",
                                    path=path)
            (lod_levels,) = struct.unpack("<Q", read(8, "LoD level"))
            if lod_levels > 16:
                raise BadInputError(f"not Paddle inference weights: {where} claims {lod_levels} LoD levels", path=path)
            for _ in range(lod_levels):
                (n,) = struct.unpack("<Q", read(8, "LoD size"))
                if n > size:
                    raise BadInputError(f"truncated weights: {where} has a LoD of {n} bytes, the file {size}", path=path)
                read(n, "LoD")
            read(4, "tensor version")
            (desc_size,) = struct.unpack("<i", read(4, "descriptor size"))
            if not 0 < desc_size < 1 << 20:
                raise BadInputError(f"not Paddle inference weights: {where} has a descriptor of {desc_size} bytes", path=path)
            try:
                dtype, dims = _tensor_desc(read(desc_size, "descriptor"))
            except ValueError as e:
                raise BadInputError(f"not Paddle inference weights: {where} has a bad descriptor ({e})", path=path) from None
            if dtype not in PARAM_DTYPES or any(d < 0 for d in dims):
                raise BadInputError(f"not Paddle inference weights: {where} has data type {dtype}, dims {dims}", path=path)
            if shape is not None and all(isinstance(d, int) and d >= 0 for d in shape) and list(shape) != dims:
                raise BadInputError(f"the weights do not fit the program: {where} is {dims} in the file, {list(shape)} in "
                                    "the program (the weights of another model?)", path=path)
            count = 1
            for d in dims:
                count *= d
            nbytes = count * PARAM_DTYPES[dtype][1]
            if pos + nbytes > size:
                raise BadInputError(f"truncated weights: the file ends inside {where} ({PARAM_DTYPES[dtype][0]} {dims} needs "
                                    f"{nbytes} bytes at offset {pos}, {size - pos} are left)", path=path)
            f.seek(nbytes, 1)
            pos += nbytes
    if pos != size:
        raise BadInputError(f"the weights do not fit the program: {size - pos} bytes follow its {len(ordered)} tensors "
                            "(the weights of another model?)", path=path)
    return pos


def _request(model: Path, weights: Path, spec) -> dict:

    return {"model": str(model.resolve()), "weights": str(weights.resolve()), "spec": spec_to_dict(spec)}


def parse(source, spec) -> IRModel:

    path = check_model_file(source, kind="Paddle program")
    if path.suffix.lower() not in (".json", ".pdmodel"):
        raise BadInputError("a Paddle source is the program file (inference.json or .pdmodel) with its .pdiparams", path=path)
    weights = locate_weights(path, spec)

    def collect(work: Path, response: dict) -> IRModel:
        ir = IRModel.load(work / "ir")
        ir.reference.producer = response.get("producer", "")
        return ir

    return call_in_child("modelport.parsers.paddle_child:convert_in_child", _request(path, weights, spec), path=path,
                         timeout=timeout_for(CONVERT_TIMEOUT_S), what=WHAT, collect=collect, unexpected=BadInputError)


def inspect(path: Path) -> dict:
    """The program's inputs, outputs and op histogram (and the ops paddle2onnx lacks), read in a
    child process without the weights."""

    return call_in_child("modelport.parsers.paddle_child:inspect_in_child", {"model": str(Path(path).resolve())}, path=path,
                         timeout=timeout_for(RUN_TIMEOUT_S), what=WHAT, unexpected=BadInputError)
