"""Scale-out on Ray Serve: the artifact, or a repository's models, in N replicas behind the one KServe v2 front end.

`modelport serve PATH --replicas N` (or `--min-replicas A --max-replicas B`: Ray Serve's
autoscaler on ongoing requests) starts a Ray Serve deployment whose replicas each open the
artifact in its own runtime (`Replica`); the v2 front end (`v2/`) checks and converts
each request, then hands the arrays to a replica through Ray Serve's handle, which spreads calls
over the replicas and routes around one that died while Ray Serve's controller starts its
replacement. A request in flight on a replica that dies is answered with an error the client
retries (HTTP 500 / gRPC INTERNAL naming the lost replica), never left hanging. `--address` joins
an existing cluster (`ray://…` or `host:port`); otherwise a local one is started on 127.0.0.1
(Ray's dashboard off, usage reporting off) and stopped with the server.

`modelport serve REPO --replicas N` serves a repository the same way: the front end keeps the
repository (versions, load and unload, rollout: `v2/repository.py`), each version checked on its
reference sample in this process before it serves, and the replicas open the versions they are
asked for (Ray Serve's model multiplexing, `start_repository_replicas`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from modelport.errors import BadInputError, one_line

NUM_CPUS = 0.5  # a replica's CPU share: two replicas fit a 2-core machine beside the front end


@dataclass(frozen=True)
class Scale:
    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    address: str | None = None

    @property
    def on_ray(self) -> bool:
        return self.replicas > 1 or self.max_replicas is not None or self.address is not None

    def deployment_options(self) -> dict:
        """Ray Serve's deployment options: a fixed count, or autoscaling bounds."""
        if self.max_replicas is not None:
            low = self.min_replicas if self.min_replicas is not None else 1
            if not 0 <= low <= self.max_replicas or self.max_replicas < 1:
                raise BadInputError(f"--min-replicas {low} and --max-replicas {self.max_replicas}: need 0 <= min <= max, max >= 1")
            return {"autoscaling_config": {"min_replicas": low, "max_replicas": self.max_replicas,
                                           "target_ongoing_requests": 2}}
        if self.replicas < 1:
            raise BadInputError(f"--replicas {self.replicas}: at least 1")
        return {"num_replicas": self.replicas}


class Replica:
    """One replica: the artifact opened in its runtime (`modelport.runtimes`), answering arrays."""

    def __init__(self, path: str, runtime: str, threads: int | None = None):
        from modelport.runtimes import RUNNERS

        self.runner = RUNNERS.load(runtime).open(path, threads=threads)
        self.pid = os.getpid()

    def infer(self, feeds: dict) -> dict:
        from modelport.serving.v2.model import REPLICA

        return {**self.runner.run(feeds), REPLICA: self.pid}


def start_replicas(name: str, path: str, runtime: str, threads: int | None, scale: Scale):
    """Ray (local on 127.0.0.1, or `scale.address`) and the deployment; returns its handle."""
    serve = _ray_serve(scale)
    deployment = serve.deployment(Replica, name=name, ray_actor_options={"num_cpus": NUM_CPUS},
                                  **scale.deployment_options())
    return serve.run(deployment.bind(path, runtime, threads), name=name, route_prefix=None)


def start_repository_replicas(app: str, threads: int | None, scale: Scale, per_replica: int):
    """A repository's replicas: each opens a model version on its first call for it, keeps at most
    `per_replica` of them (Ray Serve's model multiplexing: the least recently used one goes), and
    Ray Serve routes a version's calls to the replicas that hold it. Returns the handle."""
    serve = _ray_serve(scale)
    deployment = serve.deployment(repository_replica(per_replica), name=app, ray_actor_options={"num_cpus": NUM_CPUS},
                                  **scale.deployment_options())
    return serve.run(deployment.bind(threads), name=app, route_prefix=None)


def repository_replica(per_replica: int):
    """The replica class of a repository, its multiplexed loader holding `per_replica` versions."""
    from ray import serve

    class RepositoryReplica:
        def __init__(self, threads: int | None = None):
            self.threads, self.where, self.pid = threads, {}, os.getpid()

        @serve.multiplexed(max_num_models_per_replica=per_replica)
        async def get_model(self, model_id: str):
            from modelport.runtimes import RUNNERS

            path, runtime = self.where[model_id]
            return RUNNERS.load(runtime).open(path, threads=self.threads)

        async def infer(self, model_id: str, path: str, runtime: str, feeds: dict) -> dict:
            from modelport.serving.v2.model import REPLICA

            self.where[model_id] = (path, runtime)
            runner = await self.get_model(model_id)
            return {**runner.run(feeds), REPLICA: self.pid}

    return RepositoryReplica


def _ray_serve(scale: Scale):
    """Ray started (local on 127.0.0.1) or joined (`scale.address`), and Ray Serve on it, without its HTTP proxy."""
    try:
        import ray
        from ray import serve
    except ImportError:
        from modelport.errors import MissingDependencyError

        raise MissingDependencyError("Ray Serve is needed for --replicas", hint='pip install "modelport[serve]"') from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if scale.address:
        kwargs["address"] = scale.address
    else:
        kwargs.update(address="local", _node_ip_address="127.0.0.1")
    try:
        ray.init(**kwargs)
    except ConnectionError as e:
        raise BadInputError(f"cannot reach the Ray cluster at {scale.address}: {one_line(e)}") from None
    serve.start(proxy_location="Disabled", http_options={"host": "127.0.0.1"})
    return serve


def replica_infer(handle):
    """The coroutine handing one call to a replica through Ray Serve's handle."""

    async def infer(feeds: dict) -> dict:
        return await handle.infer.remote(feeds)

    return infer


def version_infer(handle, model_id: str, path: str, runtime: str):
    """The coroutine handing one call for a repository's version (`model_id`, opened from `path` in
    `runtime`) to a replica that holds it, or to one that opens it."""
    routed = handle.options(multiplexed_model_id=model_id)

    async def infer(feeds: dict) -> dict:
        return await routed.infer.remote(model_id, path, runtime, feeds)

    return infer


def stop(app: str, *, started_here: bool) -> None:
    """The deployment removed from a cluster this process joined, or the local Ray it started shut
    down (Ray Serve's own shutdown can wait 30 s on its controller)."""
    try:
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        if not started_here:
            serve.delete(app, _blocking=False)
        ray.shutdown()
    except Exception:
        pass
