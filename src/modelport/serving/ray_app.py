"""The Ray Serve application a `package --for ray-serve` bundle runs: `serve run serve_config.yaml`
(or a KubeRay `RayService`) builds it from the config's `import_path: modelport.serving.ray_app:build`.

Two deployments: `Replica` (`ray_serve.py`: the artifact in its runtime, as many as the config's
`num_replicas` or `autoscaling_config` say) and `V2Ingress`, Ray Serve's HTTP ingress, whose
FastAPI app carries KServe's own v2 REST endpoints (health, metadata, infer, the exception
handlers that turn a bad request into a 4xx) over a KServe model registry holding one
`v2_server.make_model` model that hands each request's arrays to a replica. Ray Serve's proxy
serves it on the config's `http_options` (127.0.0.1 unless the config says otherwise); gRPC is
`modelport serve --replicas`' (Ray Serve's gRPC proxy takes user-defined services only).

`build(args)`: `model` (the artifact's path, absolute or relative to `root`), `runtime` (its
`modelport.runtimes` name), `name`, `contract` ({inputs, outputs} as in report.json), optional
`threads`, `max_batch_size`, `max_queue_delay_ms`, `root`.
"""

from __future__ import annotations

from pathlib import Path

from ray import serve

from modelport.serving.v2_server import require_kserve

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
        from modelport.serving.ray_serve import replica_infer
        from modelport.serving.v2_server import Batcher, make_model

        infer = replica_infer(replica)
        batching = Batcher(infer, max_batch_size, max_queue_delay_ms / 1000) if max_batch_size > 1 else None
        model = make_model(name, infer, [TensorSpec.from_dict(s) for s in contract["inputs"]],
                           [TensorSpec.from_dict(s) for s in contract["outputs"]], batching)
        import importlib

        # this method travels by value (Ray Serve's ingress wraps the class): the module's own
        # registry is reached through the import system, not through a copied global
        importlib.import_module(__name__)._MODELS[model.name] = model


def build(args: dict):
    """The application of a bundle's Serve config (module docstring)."""
    from modelport.serving.ray_serve import NUM_CPUS, Replica

    model = Path(args["model"])
    if not model.is_absolute():
        model = Path(args.get("root") or ".") / model
    replica = serve.deployment(Replica, name="Replica", ray_actor_options={"num_cpus": NUM_CPUS})
    return V2Ingress.bind(replica.bind(str(model), args["runtime"], args.get("threads")), args["name"], args["contract"],
                          int(args.get("max_batch_size") or 0), float(args.get("max_queue_delay_ms") or 2.0))
