"""One worker of `serve --workers N` (started by `workers.Supervisor`): `python -m
modelport.serving.v2.worker SPEC_JSON`. Opens the artifact in its runtime, serves on the
supervisor's REST socket and the shared gRPC port, and writes one byte to `ready_fd` once serving."""

from __future__ import annotations

import json
import os
import socket
import sys


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    from modelport.ir import TensorSpec
    from modelport.runtimes import RUNNERS
    from modelport.serving.v2.model import local_model
    from modelport.serving.v2.repository import Fixed
    from modelport.serving.v2.server import ServeOptions, run
    from modelport.serving.v2.stats import Layout, Stats

    options = ServeOptions(**spec["options"])
    stats = Stats(Layout(**spec["stats"]), worker=spec["index"])
    runner = RUNNERS.load(spec["runtime"]).open(spec["path"], threads=spec["threads"])
    model = local_model(spec["name"], runner, [TensorSpec.from_dict(s) for s in spec["inputs"]],
                        [TensorSpec.from_dict(s) for s in spec["outputs"]], stats, platform=spec["platform"],
                        max_batch_size=options.max_batch_size, max_queue_delay_ms=options.max_queue_delay_ms,
                        tag={"worker": str(os.getpid())})
    stats.mine[model.slot, 15] = 0  # PENDING: a replaced worker's requests in flight are gone
    sock = socket.socket(fileno=spec["http_fd"])

    def serving():
        os.write(spec["ready_fd"], b"1")
        os.close(spec["ready_fd"])

    run(Fixed({model.name: model}), stats, options, http_sock=sock, on_serving=serving)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
