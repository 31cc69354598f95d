"""The Ray Serve application a `package --for ray-serve` bundle runs: `serve run serve_config.yaml`
(or a KubeRay `RayService`) builds it from the config's `import_path: modelport.serving.ray_app:build`.

Two deployments: `Replica` (`ray_serve.py`: the artifact in its runtime, as many as the config's
`num_replicas` or `autoscaling_config` say) and `V2Ingress`, Ray Serve's HTTP ingress, whose
FastAPI app carries KServe's own v2 REST endpoints (health, metadata, infer, the exception
handlers that turn a bad request into a 4xx) over a KServe model registry holding one
`make_model` model that hands each request's arrays to a replica. Ray Serve's proxy
serves it on the config's `http_options` (127.0.0.1 unless the config says otherwise); gRPC is
`modelport serve --replicas`' (Ray Serve's gRPC proxy takes user-defined services only).

`build(args)`: `model` (the artifact's path, absolute or relative to `root`), `runtime` (its
`modelport.runtimes` name), `name`, `contract` ({inputs, outputs} as in report.json), optional
`threads`, `max_batch_size`, `max_queue_delay_ms`, `root`.
"""

from __future__ import annotations

from pathlib import Path

from ray import serve

from modelport.deps import require
from modelport.errors import MissingDependencyError
from modelport.serving.ray_serve import NUM_CPUS, Replica, replica_infer

KSERVE_INSTALL = 'pip install "modelport[serve]", then pip install --no-deps kserve==0.21.0 (make setup does both)'


def require_kserve():
    """KServe's Python server, or exit 5 naming how to install it (it is installed without its
    dependencies: it declares psutil<6 and pandas<3, which would downgrade both under the rest)."""

    try:
        return require("kserve", purpose="the Ray Serve bundle's ingress")
    except MissingDependencyError as e:
        raise MissingDependencyError(e.reason, hint=KSERVE_INSTALL) from None


require_kserve()  # exit 5 naming the install, before KServe's classes below
from kserve.model_repository import ModelRepository  # noqa: E402

_APP = None
_MODELS: dict = {}  # this process's models: what the ingress replica's __init__ registers


class Registry(ModelRepository):
    """A KServe model registry whose models are this process's `_MODELS`, looked up at each call:
    Ray Serve ships the ingress's FastAPI app to the replica by value, so a registry holding its own
    dict would be a copy the replica's __init__ never fills (this class travels by reference)."""

    @property
    def models(self):
        return _MODELS

    @models.setter
    def models(self, value):
        pass


def _app():
    """KServe's v2 REST endpoints on one FastAPI app over the process's model registry."""
    global _APP
    if _APP is None:
        import fastapi
        from kserve.protocol.dataplane import DataPlane
        from kserve.protocol.model_repository_extension import ModelRepositoryExtension
        from kserve.protocol.rest.server import RESTServer

        registry = Registry()
        rest = RESTServer("kserve.model_server:app", DataPlane(model_registry=registry), ModelRepositoryExtension(registry),
                          http_port=0)
        _APP = fastapi.FastAPI(title="modelport (KServe v2 on Ray Serve)", docs_url=None, redoc_url=None)
        rest._register_endpoints(_APP)
        rest._add_exception_handlers(_APP)
    return _APP


@serve.deployment(name="V2Ingress")
@serve.ingress(_app())
class V2Ingress:
    def __init__(self, replica, name: str, contract: dict, max_batch_size: int = 0, max_queue_delay_ms: float = 2.0):
        from modelport.ir import TensorSpec
        from modelport.serving.v2.model import Batcher, timed

        infer = replica_infer(replica)
        batching = Batcher(timed(infer), max_batch_size, max_queue_delay_ms / 1000) if max_batch_size > 1 else None
        model = make_model(name, infer, [TensorSpec.from_dict(s) for s in contract["inputs"]],
                           [TensorSpec.from_dict(s) for s in contract["outputs"]], batching)
        import importlib

        # this method travels by value (Ray Serve's ingress wraps the class): the module's own
        # registry is reached through the import system, not through a copied global
        importlib.import_module(__name__)._MODELS[model.name] = model


def make_model(name: str, infer, inputs, outputs, batching):
    """The `kserve.Model` of one artifact for KServe's REST endpoints: `infer(feeds)` answers one
    call (a replica's); `batching` a `v2.model.Batcher` over it, or None. An output named REPLICA in
    the answer (which replica ran it) goes into the response's parameters."""
    import logging

    import numpy as np
    from kserve import InferOutput, InferRequest, InferResponse, Model
    from kserve.errors import InvalidInput

    from modelport.packaging.requests import V2_DATATYPES
    from modelport.serving.v2.model import REPLICA, check_inputs, tensor_metadata

    class V2Model(Model):
        def load(self) -> bool:
            self.ready = True
            return True

        def get_input_types(self):
            return [tensor_metadata(s) for s in inputs]

        def get_output_types(self):
            return [tensor_metadata(s) for s in outputs]

        async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
            try:
                feeds = {i.name: i.as_numpy() for i in payload.inputs}
            except Exception as e:
                raise InvalidInput(f"the request's data does not fit its shape or datatype: {e}") from None
            reason = check_inputs(feeds, inputs)
            if reason:
                raise InvalidInput(reason)
            got = (await batching.submit(feeds))[0] if batching is not None else await infer(feeds)
            replica = got.pop(REPLICA, None) if isinstance(got, dict) else None
            binary = payload.use_binary_outputs
            out = []
            for s in outputs:
                a = np.ascontiguousarray(np.asarray(got[s.name]).astype(s.dtype, copy=False))
                o = InferOutput(name=s.name, shape=list(a.shape), datatype=V2_DATATYPES[s.dtype])
                o.set_data_from_numpy(a, binary_data=binary)
                out.append(o)
            if replica is not None:
                logging.getLogger("kserve.modelport").info("infer answered by replica %s", replica)
            return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=out,
                                 use_binary_outputs=binary, requested_outputs=payload.request_outputs,
                                 parameters={"replica": str(replica)} if replica is not None else None)

    model = V2Model(name)
    model.load()
    return model


def build(args: dict):
    """The application of a bundle's Serve config (module docstring)."""

    model = Path(args["model"])
    if not model.is_absolute():
        model = Path(args.get("root") or ".") / model
    replica = serve.deployment(Replica, name="Replica", ray_actor_options={"num_cpus": NUM_CPUS})
    return V2Ingress.bind(replica.bind(str(model), args["runtime"], args.get("threads")), args["name"], args["contract"],
                          int(args.get("max_batch_size") or 0), float(args.get("max_queue_delay_ms") or 2.0))
