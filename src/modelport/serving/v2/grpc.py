"""The v2 gRPC front end: `inference.GRPCInferenceService` (the protocol KServe and Triton share,
from `tritonclient`'s generated code) on grpc.aio, over the same models as the REST front end.

Inputs come from `raw_input_contents` (`np.frombuffer` on each, no per-element work) or the typed
`contents`; outputs go back as `raw_output_contents`, as Triton answers. A request that does not fit
the model is INVALID_ARGUMENT with the same reason REST gives; an unknown model is NOT_FOUND; a
message over `--max-request-bytes` is RESOURCE_EXHAUSTED (grpc's own receive limit).
"""

from __future__ import annotations

import logging
import time

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from modelport.errors import one_line
from modelport.serving.v2.codec import NUMPY_OF, RequestError, from_raw, raw_bytes

log = logging.getLogger("modelport.serve")
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 422: grpc.StatusCode.INVALID_ARGUMENT,
           413: grpc.StatusCode.RESOURCE_EXHAUSTED, 500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE}


def _feeds(request) -> dict[str, np.ndarray]:
    feeds, raw = {}, request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise RequestError(400, f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    for i, t in enumerate(request.inputs):
        shape = tuple(t.shape)
        if any(d < 0 for d in shape):
            raise RequestError(400, f"input '{t.name}': shape must be non-negative, got {list(shape)}")
        if raw:
            feeds[t.name] = from_raw(raw[i], t.datatype, shape, t.name)
            continue
        field = _CONTENTS.get(t.datatype)
        if field is None:
            raise RequestError(400, f"input '{t.name}': datatype '{t.datatype}' has no typed contents; send raw_input_contents")
        values = getattr(t.contents, field)
        a = np.asarray(values, dtype=object if t.datatype == "BYTES" else NUMPY_OF[t.datatype])
        if a.size != int(np.prod(shape)):
            raise RequestError(400, f"input '{t.name}': {a.size} values for shape {list(shape)}")
        feeds[t.name] = a.reshape(shape)
    return feeds


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """`registry`: what is served (`repository.Repository` or `repository.Fixed`)."""

    def __init__(self, registry, stats, server: dict):
        self.registry, self.stats, self.server = registry, stats, server

    async def _model(self, name: str, version: str, context):
        try:
            return await self.registry.get(name, version)
        except RequestError as e:
            await context.abort(_STATUS.get(e.status, grpc.StatusCode.UNAVAILABLE), e.reason)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=bool(self.registry.ready()))

    async def ModelReady(self, request, context):
        try:
            self.registry.resolve(request.name, request.version)
        except RequestError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def RepositoryIndex(self, request, context):
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**m) for m in self.registry.index(request.ready)])

    async def RepositoryModelLoad(self, request, context):
        return await self._control(self.registry.load, request.model_name, pb.RepositoryModelLoadResponse, context)

    async def RepositoryModelUnload(self, request, context):
        return await self._control(self.registry.unload, request.model_name, pb.RepositoryModelUnloadResponse, context)

    async def _control(self, action, name: str, response, context):
        try:
            await action(name)
        except RequestError as e:
            await context.abort(_STATUS.get(e.status, grpc.StatusCode.INVALID_ARGUMENT), e.reason)
        return response()

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name=self.server["name"], version=self.server["version"], extensions=self.server["extensions"])

    async def ModelMetadata(self, request, context):
        meta = (await self._model(request.name, request.version, context)).metadata()
        return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                        inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
                                        outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]])

    async def ModelStatistics(self, request, context):
        if request.name:
            models = [await self._model(request.name, request.version, context)]
        else:
            models = self.registry.loaded()
        out = []
        for m in models:
            s = self.stats.model_stats(m.name, m.version)
            inference = pb.InferStatistics(**{k: pb.StatisticDuration(**v) for k, v in s["inference_stats"].items()})
            out.append(pb.ModelStatistics(name=s["name"], version=s["version"], last_inference=s["last_inference"],
                                          inference_count=s["inference_count"], execution_count=s["execution_count"],
                                          inference_stats=inference))
        return pb.ModelStatisticsResponse(model_stats=out)

    async def ModelInfer(self, request, context):
        model = await self._model(request.model_name, request.model_version, context)
        t0 = time.perf_counter_ns()
        stats, slot = model.stats, model.slot
        model.begin()
        try:
            feeds = _feeds(request)
            outputs, params = await model.answer(feeds, [o.name for o in request.outputs] or None, t0)
            t2 = time.perf_counter_ns()
            response = pb.ModelInferResponse(
                model_name=model.name, model_version=model.version, id=request.id,
                outputs=[pb.ModelInferResponse.InferOutputTensor(name=n, datatype=d, shape=a.shape) for n, d, a in outputs],
                raw_output_contents=[bytes(raw_bytes(a)) for _, _, a in outputs])
            for k, v in params.items():
                response.parameters[k].string_param = str(v)
            t3 = time.perf_counter_ns()
            stats.phase(slot, "compute_output", t3 - t2)
            stats.request(slot, True, t3 - t0)
            return response
        except RequestError as e:
            stats.request(slot, False, time.perf_counter_ns() - t0)
            await context.abort(_STATUS.get(e.status, grpc.StatusCode.INVALID_ARGUMENT), e.reason)
        except Exception as e:
            if isinstance(e, grpc.aio.AbortError):
                raise
            stats.request(slot, False, time.perf_counter_ns() - t0)
            log.error("infer on '%s' failed: %s", model.name, e)
            await context.abort(grpc.StatusCode.INTERNAL, one_line(e, typed=True))
        finally:
            model.end()


def server(servicer: Servicer, host: str, port: int, max_request_bytes: int) -> grpc.aio.Server:
    """A grpc.aio server on host:port (SO_REUSEPORT on: workers share the port), not yet started."""
    srv = grpc.aio.server(options=[("grpc.max_receive_message_length", max_request_bytes),
                                   ("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 1)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, srv)
    bound = srv.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"gRPC cannot listen on {host}:{port}")
    return srv
