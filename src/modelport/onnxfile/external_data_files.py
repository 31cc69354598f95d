"""Weights kept in external-data files beside a model: writing a model as its graph plus a data file
of its large initializers (`write_external`), appending tensors to such a file as a model is built
(`DataFile`), and reading a model's stored tensors back into it (`attach_external`).

Each tensor starts on a page boundary of the data file, so a runtime may load it from there; bytes
already in a file are copied file to file, in the kernel where it can (`copy_file_range`).
"""

from __future__ import annotations

import os
from pathlib import Path

from modelport.onnxfile.proto_pieces import copy_fields, write_streamed
from modelport.onnxfile.tensor_sizes import raw_nbytes
from modelport.run.progress import tick

EXTERNAL_MIN_BYTES = 1024  # initializers at least this large go to the data file (onnx's own size_threshold)
EXTERNAL_ALIGN = 4096  # each tensor starts on a page boundary of the data file


def write_external(model, path: Path, data_name: str, *, base_dir: Path | None = None) -> None:
    """`model` as `path` (the graph) and `data_name` beside it (the initializers' bytes, one after
    another), written tensor by tensor without changing `model`.

    onnx's own external-data save moves every tensor's bytes out of the model and clears them; with
    the upb protobuf runtime the cleared bytes stay allocated as long as the model lives, and putting
    them back allocates the model's size a second time. Here the model is only read: the file holds
    a copy of the graph whose large initializers name their place in the data file instead.
    `base_dir`: initializers already external are copied from their file there (chunk by chunk)."""
    import onnx

    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, skip=("graph",))
    copy_fields(model.graph, skeleton.graph, skip=("initializer",))

    total = len(model.graph.initializer)
    with open(path.parent / data_name, "wb") as data:
        for index, tensor in enumerate(model.graph.initializer):
            tick("writing", tensor.name, index, total)
            out = skeleton.graph.initializer.add()
            stored = tensor.data_location == onnx.TensorProto.EXTERNAL
            if (raw_nbytes(tensor) < EXTERNAL_MIN_BYTES and not stored) or (stored and base_dir is None):
                out.CopyFrom(tensor)
                continue
            copy_fields(tensor, out, skip=("raw_data", "external_data", "data_location"))
            offset = -data.tell() % EXTERNAL_ALIGN + data.tell()
            data.seek(offset)
            if stored:
                _copy_stored(tensor, base_dir, data)
            else:
                data.write(tensor.raw_data)
            out.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(data.tell() - offset))):
                entry = out.external_data.add()
                entry.key, entry.value = key, value
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in skeleton.graph.initializer):
        (path.parent / data_name).unlink()
    write_streamed(skeleton, path)


def _copy_stored(tensor, base_dir: Path, out, chunk: int = 64 << 20) -> None:
    """Append the bytes of external `tensor` (its file in `base_dir`) to the open file `out`."""
    info = {e.key: e.value for e in tensor.external_data}
    source = base_dir / info["location"]
    if not source.resolve().is_relative_to(base_dir.resolve()):
        raise ValueError(f"initializer {tensor.name!r} refers to data outside {base_dir}")
    offset = int(info.get("offset") or 0)
    left = int(info.get("length") or 0) or (source.stat().st_size - offset)
    with open(source, "rb") as f:
        out.flush()
        try:  # in the kernel, without passing the bytes through this process
            while left > 0:
                done = os.copy_file_range(f.fileno(), out.fileno(), min(chunk, left), offset)
                if done <= 0:
                    break
                offset, left = offset + done, left - done
        except (AttributeError, OSError):
            pass
        out.seek(0, os.SEEK_END)
        f.seek(offset)
        while left > 0:
            block = f.read(min(chunk, left))
            if not block:
                raise ValueError(f"{source.name} ends inside initializer {tensor.name!r}")
            out.write(block)
            left -= len(block)


class DataFile:
    """An external-data file written tensor by tensor as a model is built or rewritten: `add` appends
    an array and returns the TensorProto that refers to it (small arrays stay inline), `copy` appends
    the bytes of an external TensorProto read from its own file. Nothing is held after it is written."""

    def __init__(self, path: Path):
        self.path, self.offset = Path(path), 0
        self._out = open(self.path, "wb")  # noqa: SIM115 - closed by close() / the with block

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        self._out.close()

    def _start(self) -> int:
        pad = -self.offset % EXTERNAL_ALIGN
        if pad:
            self._out.write(b"\0" * pad)
            self.offset += pad
        return self.offset

    def _refer(self, out, start: int) -> None:
        import onnx

        out.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(start)), ("length", str(self.offset - start))):
            entry = out.external_data.add()
            entry.key, entry.value = key, value

    def add(self, name: str, value):
        import numpy as np
        import onnx
        from onnx import numpy_helper

        value = np.ascontiguousarray(value)
        if value.nbytes < EXTERNAL_MIN_BYTES:
            return numpy_helper.from_array(value, name)
        start = self._start()
        self._out.write(value.data)
        self.offset += value.nbytes
        out = onnx.TensorProto(name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(value.dtype), dims=value.shape)
        self._refer(out, start)
        return out

    def copy(self, tensor, base_dir: Path):
        """`tensor` (external, its file in `base_dir`) appended here; returns the new TensorProto."""
        import onnx

        out = onnx.TensorProto()
        copy_fields(tensor, out, skip=("raw_data", "external_data", "data_location"))
        start = self._start()
        _copy_stored(tensor, base_dir, self._out)
        self.offset = self._out.tell()
        self._refer(out, start)
        return out


def attach_external(model, base_dir: str | Path) -> None:
    """Read, in place, the data of every external initializer of `model`'s main graph from its file
    in `base_dir` (tensor by tensor: one tensor's bytes in flight at a time)."""
    import onnx
    import onnx.external_data_helper as edh


    total = len(model.graph.initializer)
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tick("reading", tensor.name, index, total)
            edh.load_external_data_for_tensor(tensor, str(base_dir))
            tensor.ClearField("data_location")
            del tensor.external_data[:]
