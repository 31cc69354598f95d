"""Loading and saving ONNX models safely.

Before onnx or onnxruntime reads an external-data file, every reference is checked
(`external_data_checks`). Saving switches to external data when the proto would pass the 2 GiB
protobuf limit, and always writes the data file afresh, so a rerun never grows it.

The parts live in modules of their own: `external_data_checks` (the safety checks), `tensor_sizes`
(tensor bytes and the protobuf limit), `proto_pieces` (reading, writing and measuring a model field
by field), `external_data_files` (data files beside a model), `weightless_copy` (checking a model
without its weights), `ir_version_fit` and `contract_stamp`.
"""

from __future__ import annotations

from pathlib import Path

from modelport.errors import BadInputError
from modelport.onnxfile.external_data_checks import check_external_data
from modelport.onnxfile.external_data_files import write_external
from modelport.onnxfile.proto_pieces import read_skeleton, write_streamed
from modelport.onnxfile.tensor_sizes import protobuf_limit, tensor_bytes
from modelport.run.file_checks import check_model_file

# Above this many bytes of tensor data a model is saved with its weights in a side file.
EXTERNAL_DATA_THRESHOLD = 1 << 30


def _parse(path: Path, *, weights: bool = True):
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False) if weights else read_skeleton(path)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise BadInputError(f"truncated or not an ONNX model ({type(e).__name__})", path=path) from None
    if not model.HasField("graph") or model.ir_version == 0 or (not model.graph.node and not model.graph.output):
        raise BadInputError("truncated or not an ONNX model (no graph)", path=path)
    return model


def external_files(path: str | Path) -> list[Path]:
    """The external-data files an ONNX file references (after the safety checks)."""
    path = Path(path)
    return check_external_data(_parse(path), path.parent, path)


def load_onnx(path: str | Path, *, load_external: bool = True, weights: bool = True):
    """Load an ONNX model; external data is checked, then read. `weights=False`: the graph, its
    contract and its initializers' names, types and shapes, none of their bytes (`read_skeleton`),
    for a caller that reads what the model takes and gives: a one-file model's weights are never
    read into memory."""
    import onnx.external_data_helper as edh

    path = check_model_file(path, kind="ONNX model")
    if path.is_dir():
        raise BadInputError("is a folder, expected an .onnx file", path=path)
    model = _parse(path, weights=weights)
    check_external_data(model, path.parent, path)
    if load_external and weights:
        try:
            edh.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError) as e:
            raise BadInputError(f"cannot read external data: {e}", path=path) from None
    return model


def save_onnx(model, path: str | Path, *, external: bool | None = None, base_dir: str | Path | None = None) -> list[Path]:
    """Save `model` (with all data in memory) to `path`; returns the files written. `model` is not changed.

    External data goes to `<name>.data` beside the model when asked for or when the tensors
    would not fit the protobuf limit. Any existing data file is removed first (onnx appends).
    `base_dir`: `model`'s initializers that refer to external data are read from there, one at a
    time, and copied into the new data file (`external` must then be true): a model whose weights
    are in files is saved without ever being held in memory.
    """

    path = Path(path)
    data_name = path.name + ".data"
    data_path = path.parent / data_name
    if data_path.exists():
        data_path.unlink()
    if external is None:
        external = tensor_bytes(model) + (1 << 20) > min(EXTERNAL_DATA_THRESHOLD, protobuf_limit())
    if external:
        write_external(model, path, data_name, base_dir=Path(base_dir) if base_dir is not None else None)
        return [path, data_path] if data_path.exists() else [path]
    if base_dir is not None:
        raise ValueError(f"{path.name}: weights read from {base_dir} are saved as external data only")
    if tensor_bytes(model) + (1 << 20) > protobuf_limit():
        raise ValueError(f"{path.name}: the model's tensors pass the 2 GiB protobuf limit; save it with external data")
    write_streamed(model, path)
    return [path]


def model_files(path: str | Path) -> list[Path]:
    """The model file plus its external-data files."""
    path = Path(path)
    return [path, *external_files(path)]
