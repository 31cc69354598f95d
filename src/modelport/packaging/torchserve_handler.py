"""TorchServe handler for a modelport bundle; copied into the .mar as `modelport_handler.py`.

It depends on numpy and the model's runtime only (never on modelport): everything it needs to
know (input/output names, dtypes, layouts, preprocessing, postprocessing, which runtime runs the
model) is read from `modelport.json`, the I/O contract written into the same archive. The runtime
is onnxruntime (`model.onnx`) or torch: the emitted `model.py` is imported from its path under a
name of its own (never as a bare `model` module), `Model()` gets the weights of
`model.safetensors` and runs in eval mode under `torch.inference_mode()`.

Request body (JSON): `{"inputs": {NAME: nested list, ...}}` or `{NAME: nested list, ...}`; add
`"preprocessed": true` to skip the contract's preprocessing for data that already had it.
Response: `{"outputs": {NAME: nested list}}`, or for `topk=K` `{NAME: {"indices", "values"}}`.
"""

import importlib.util
import json
import os

import numpy as np


class ModelportHandler:
    def __init__(self):
        self.initialized = False
        self.meta = None
        self.session = None
        self.module = None
        self.device = None

    def initialize(self, context):
        model_dir = context.system_properties.get("model_dir") or "."
        with open(os.path.join(model_dir, "modelport.json")) as f:
            self.meta = json.load(f)
        serving = self.meta["serving"]
        model_path = os.path.join(model_dir, serving["model_file"])
        if serving["runtime"] == "onnxruntime":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            providers = ["CPUExecutionProvider"]
            if context.system_properties.get("gpu_id") is not None and "CUDAExecutionProvider" in ort.get_available_providers():
                providers.insert(0, "CUDAExecutionProvider")
            self.session = ort.InferenceSession(model_path, opts, providers=providers)
        elif serving["runtime"] == "torch":
            self.module = self.load_torch(os.path.join(model_dir, serving["code_file"]), model_path,
                                          context.system_properties.get("gpu_id"))
        else:
            raise RuntimeError("unknown runtime in modelport.json: " + str(serving["runtime"]))
        self.initialized = True

    def load_torch(self, code_path, weights_path, gpu_id):
        import torch
        from safetensors.torch import load_file

        spec = importlib.util.spec_from_file_location("modelport_served_model_" + str(os.getpid()), code_path)
        code = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(code)
        model = code.Model()
        model.load_state_dict(load_file(weights_path))
        self.device = torch.device("cpu")
        if gpu_id is not None and torch.cuda.is_available():
            self.device = torch.device("cuda", int(gpu_id))
        return model.to(self.device).eval()

    @staticmethod
    def flat(out):
        """Tensors of a module's output in order (a tensor, or nested tuples/lists of them)."""
        if isinstance(out, (list, tuple)):
            return [t for v in out for t in ModelportHandler.flat(v)]
        if isinstance(out, dict):
            return [t for v in out.values() for t in ModelportHandler.flat(v)]
        return [out]

    # -- pre/post-processing, driven by the contract -------------------------------------------------

    @staticmethod
    def channel_axis(spec, rank):
        layout = spec.get("layout") or ""
        if len(layout) == rank and "C" in layout:
            return layout.index("C")
        return 1 if rank >= 3 else rank - 1

    def preprocess_one(self, spec, array):
        """x' = (x * scale - mean) / std along the channel axis, channels reversed for BGR models."""
        pre = spec.get("preprocess") or {}
        if not pre:
            return array
        x = array.astype(np.float32)
        axis = self.channel_axis(spec, x.ndim)
        if pre.get("channel_order") == "BGR":
            x = np.flip(x, axis=axis)
        if pre.get("scale") is not None:
            x = x * np.float32(pre["scale"])
        shape = [1] * x.ndim
        shape[axis] = -1
        if pre.get("mean") is not None:
            x = x - np.asarray(pre["mean"], dtype=np.float32).reshape(shape)
        if pre.get("std") is not None:
            x = x / np.asarray(pre["std"], dtype=np.float32).reshape(shape)
        return x.astype(spec["dtype"])

    def feeds_from(self, body):
        if isinstance(body, (bytes, bytearray)):
            body = json.loads(body.decode("utf-8"))
        if isinstance(body, str):
            body = json.loads(body)
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        values = body.get("inputs", body)
        skip_pre = bool(body.get("preprocessed")) or not self.meta["serving"].get("preprocess", True)
        feeds = {}
        for spec in self.meta["inputs"]:
            if spec["name"] not in values:
                raise ValueError("missing input '{}'; the model takes {}".format(spec["name"], [s["name"] for s in self.meta["inputs"]]))
            array = np.asarray(values[spec["name"]])
            array = array if skip_pre else self.preprocess_one(spec, array)
            feeds[spec["name"]] = np.ascontiguousarray(array.astype(spec["dtype"], copy=False))
        return feeds

    def run(self, feeds):
        names = [s["name"] for s in self.meta["outputs"]]
        if self.module is None:
            return dict(zip(names, self.session.run(names, feeds), strict=True))
        import torch

        args = [torch.from_numpy(feeds[s["name"]]).to(self.device) for s in self.meta["inputs"]]
        with torch.inference_mode():
            outs = self.flat(self.module(*args))
        return dict(zip(names, [o.detach().cpu().numpy() for o in outs], strict=True))

    def postprocess(self, outputs):
        mode = self.meta["serving"].get("postprocess") or "none"
        if mode == "none":
            return {"outputs": {k: v.tolist() for k, v in outputs.items()}}
        if mode == "softmax":
            return {"outputs": {k: self.softmax(v).tolist() for k, v in outputs.items()}}
        if mode.startswith("topk="):
            k = int(mode[5:])
            result = {}
            for name, v in outputs.items():
                idx = np.argsort(-v, axis=-1)[..., :k]
                result[name] = {"indices": idx.tolist(), "values": np.take_along_axis(v, idx, axis=-1).tolist()}
            return {"outputs": result}
        raise ValueError("unknown postprocess mode " + mode)

    @staticmethod
    def softmax(v):
        e = np.exp(v - v.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def handle(self, data, context):
        if not self.initialized:
            self.initialize(context)
        responses = []
        for request in data or []:
            body = request.get("body") if request.get("body") is not None else request.get("data")
            responses.append(self.postprocess(self.run(self.feeds_from(body))))
        return responses
