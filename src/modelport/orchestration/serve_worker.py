"""One worker of `serve --workers N` (started by `serving.v2.workers.Supervisor`): `python -m
modelport.orchestration.serve_worker SPEC_JSON`. Opens the artifact (or the repository) here,
serves on the supervisor's REST socket and the shared gRPC port, and writes one byte to `ready_fd`
once serving. A repository's worker also listens on its own unix socket (`peers[index]`), where
the other workers hand it the load and unload calls they take."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from modelport.ir import TensorSpec
from modelport.runtimes import RUNNERS
from modelport.serving.v2.stats import PENDING, Layout, Stats


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    from modelport.serving.v2.model import local_model
    from modelport.serving.v2.peers import Peers
    from modelport.serving.v2.repository import Fixed
    from modelport.serving.v2.server import ServeOptions, run

    options = ServeOptions(**spec["options"])
    stats = Stats(Layout(**spec["stats"]), worker=spec["index"])
    stats.mine[:, PENDING] = 0  # a replaced worker's requests in flight are gone
    tag = {"worker": str(os.getpid())}
    extra = []
    if spec.get("repository"):
        from modelport.orchestration.serve import repository_registry

        own = spec["peers"][spec["index"]]
        registry = Peers(repository_registry(Path(spec["repository"]), options, spec["threads"], stats, tag),
                         [p for i, p in enumerate(spec["peers"]) if i != spec["index"]])
        if os.path.exists(own):
            os.unlink(own)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(own)
        unix.listen(64)
        extra.append(unix)
    else:

        runner = RUNNERS.load(spec["runtime"]).open(spec["path"], threads=spec["threads"])
        model = local_model(spec["name"], runner, [TensorSpec.from_dict(s) for s in spec["inputs"]],
                            [TensorSpec.from_dict(s) for s in spec["outputs"]], stats, platform=spec["platform"],
                            max_batch_size=options.max_batch_size, max_queue_delay_ms=options.max_queue_delay_ms, tag=tag)
        registry = Fixed({model.name: model})
    sock = socket.socket(fileno=spec["http_fd"])

    def serving():
        os.write(spec["ready_fd"], b"1")
        os.close(spec["ready_fd"])

    run(registry, stats, options, http_sock=sock, extra_sockets=extra, on_serving=serving)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
