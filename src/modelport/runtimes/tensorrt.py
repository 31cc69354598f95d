"""TensorRT engine runner (`.plan`), on a CUDA GPU with device buffers from torch.

When the engine sits beside a `tensorrt/` build folder and was built for another GPU or
TensorRT version (its `engine.json` says which), the runner rebuilds it with the folder's build
script instead of failing to deserialize.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.errors import BadInputError, MissingDependencyError
from modelport.ir import TensorSpec
from modelport.runtimes.base import Capabilities, Runner
from modelport.runtimes.trt_build_script import ensure_engine


def _require_gpu():

    trt = require("tensorrt", purpose="running TensorRT engines")
    torch = require("torch", purpose="CUDA buffers for TensorRT")
    if not torch.cuda.is_available():
        raise MissingDependencyError("no CUDA GPU is visible: TensorRT engines run on NVIDIA GPUs only")
    return trt, torch


def engine_info(path: str | Path) -> dict:
    """What `inspect` shows for a .plan: its recorded build, and I/O when TensorRT can load it here."""
    path = Path(path)
    info: dict = {"format": "tensorrt-engine", "size": path.stat().st_size}
    meta = path.parent / "tensorrt" / "engine.json"
    if meta.exists():
        import json

        info["built_for"] = json.loads(meta.read_text())
    try:
        runner = TensorRTRunner(path, rebuild=False)
    except MissingDependencyError as e:
        info["note"] = e.message
        return info
    info["inputs"] = [{"name": n, "dtype": str(d), "shape": list(s)} for n, d, s in runner.io(True)]
    info["outputs"] = [{"name": n, "dtype": str(d), "shape": list(s)} for n, d, s in runner.io(False)]
    return info


class TensorRTRunner(Runner):
    """A TensorRT engine on the GPU: validated in this process, where the GPU is (`in_process`)."""

    name = "tensorrt"
    imports = ("tensorrt", "torch")
    capabilities = Capabilities(in_process=True)

    def __init__(self, model, *, output_names: list[str] | None = None, rebuild: bool = True):
        trt, self.torch = _require_gpu()
        self.trt = trt
        self.path = Path(model)
        folder = self.path.parent / "tensorrt"
        if rebuild and (folder / "plan.json").exists():

            ensure_engine(folder, log=lambda *_: None)
        self.logger = trt.Logger(trt.Logger.ERROR)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(self.path.read_bytes())
        if self.engine is None:
            raise BadInputError("TensorRT cannot deserialize the engine (built for another GPU or TensorRT version?)",
                                path=self.path, hint="rebuild it: python tensorrt/build_engine.py --force")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == mode]
        self.engine_outputs = [n for n in names if self.engine.get_tensor_mode(n) != mode]
        self.output_names = output_names

    def io(self, inputs: bool):
        names = self.input_names if inputs else self.engine_outputs
        return [(n, np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(n))), tuple(self.engine.get_tensor_shape(n)))
                for n in names]

    def input_specs(self) -> list[TensorSpec]:
        """The engine's inputs; dims the optimisation profile leaves open are symbolic ('dimK')."""
        return [TensorSpec(n, d.name, [x if x > 0 else f"dim{k}" for k, x in enumerate(s)]) for n, d, s in self.io(True)]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch, trt = self.torch, self.trt
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise BadInputError(f"missing inputs {missing}; the engine expects {self.input_names}", path=self.path)
        keep = []
        for n in self.input_names:
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(n)))
            t = torch.from_numpy(np.ascontiguousarray(feeds[n].astype(dtype, copy=False))).cuda()
            keep.append(t)
            if not self.context.set_input_shape(n, tuple(t.shape)):
                raise BadInputError(f"input '{n}' shape {tuple(t.shape)} is outside the engine's optimisation profile",
                                    path=self.path)
            self.context.set_tensor_address(n, t.data_ptr())
        outs = {}
        for n in self.engine_outputs:
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(n)))
            shape = tuple(self.context.get_tensor_shape(n))
            t = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, device="cuda")
            outs[n] = t
            self.context.set_tensor_address(n, t.data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise BadInputError("TensorRT execution failed", path=self.path)
        stream.synchronize()
        arrays = [outs[n].cpu().numpy() for n in self.engine_outputs]
        # TensorRT keeps the ONNX tensor names, so outputs are matched by name
        return dict(zip(self.engine_outputs, arrays, strict=False))


def open_engine(path: str | Path, **options) -> TensorRTRunner:
    """A user's engine, run as it is (never rebuilt from a build folder beside it)."""
    return TensorRTRunner(path, rebuild=False, **options)
