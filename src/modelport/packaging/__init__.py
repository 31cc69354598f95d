"""Packagers turn converted artifacts into bundles a model server loads as they are.

A registry keyed by the `--for` name. Each packager module has `NAME`, `DESCRIPTION` and
`package(artifacts: Artifacts, out_dir: Path, options: PackageOptions) -> Bundle`; it writes into
`out_dir` (a staging folder the caller renames into place) and takes every name, dtype and dim
from the artifacts' I/O contract. Adding a server is one module plus one line in PACKAGERS (declared in `modelport/registry.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from modelport.errors import BadInputError
from modelport.packaging.quantities import check_quantity
from modelport.registry import PACKAGERS, choice
from modelport.run.names import check_path_name
from modelport.run.staging import describe_files

register_packager = PACKAGERS.register
canonical = PACKAGERS.canonical

# servers a container bundle (k8s, kserve) can wrap
SERVERS = ("triton", "torchserve", "tfserving", "ovms")


POSTPROCESS = ("none", "softmax", "topk=K")
DEVICES = ("cpu", "gpu")
SCALE_ON = ("cpu", "pending-requests")  # k8s: what the HorizontalPodAutoscaler follows


@dataclass(frozen=True)
class PackageOptions:
    """Every packaging option, declared and validated once; the CLI and the Python API fill the same fields."""

    model_name: str | None = None  # default: the source file's stem, sanitised
    version: int | None = None  # default 1, or the next free version with add_version
    add_version: bool = False  # add a version to an existing Triton/TF Serving repository
    force: bool = False
    backend: str | None = None  # triton: onnx|tensorrt|savedmodel|torchscript|openvino (default: first available)
    runtime: str | None = None  # torchserve handler: onnxruntime|torch (default: torch when the PyTorch code is there)
    trust: bool = False  # allow importing the emitted model.py to trace it into TorchScript (Triton)
    max_batch_size: int = 8  # triton, when the contract has a dynamic batch axis
    preferred_batch_sizes: list[int] = field(default_factory=list)
    queue_delay_us: int = 100
    dynamic_batching: bool = True
    instances: int = 1
    device: str = "cpu"  # cpu | gpu
    trt_acceleration: bool = False  # triton: TensorRT execution accelerator for ONNX on GPU
    trt_precision: str = "FP16"
    postprocess: str = "none"  # torchserve handler: none | softmax | topk=K
    preprocess: bool = True  # torchserve handler applies the contract's preprocessing
    server: str = "triton"  # k8s / kserve: which server's bundle the container runs
    image: str | None = None  # k8s: the image built from the Dockerfile
    replicas: int | None = None  # k8s: a fixed scale (no autoscaler); default: autoscaled between min and max
    min_replicas: int | None = None  # autoscaling range, default 1..4
    max_replicas: int | None = None
    target_cpu_utilization: int = 70
    scale_on: str = "cpu"  # k8s: cpu, or pending-requests (the server's queue: Triton's nv_inference_pending_request_count)
    target_pending: int = 4  # pending-requests: the average per pod the autoscaler keeps
    cpu: str = "1"
    memory: str = "2Gi"
    gpus: int | None = None  # default: 1 when the device is gpu or the artifact needs one
    namespace: str | None = None
    storage_uri: str | None = None  # kserve
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        import re


        object.__setattr__(self, "device", choice(self.device, DEVICES, "device"))
        object.__setattr__(self, "server", choice(self.server, SERVERS, "server"))
        object.__setattr__(self, "scale_on", choice(self.scale_on, SCALE_ON, "--scale-on metric"))
        if self.target_pending < 1:
            raise BadInputError("bad --target-pending: must be at least 1")
        if not re.fullmatch(r"none|softmax|topk=[1-9]\d*", str(self.postprocess).strip().lower()):
            raise BadInputError(f"unknown postprocess '{self.postprocess}'; known: {', '.join(POSTPROCESS)}")
        for what, v in (("--instances", self.instances), ("--replicas", self.replicas), ("--max-batch", self.max_batch_size + 1),
                        ("--min-replicas", self.min_replicas), ("--max-replicas", self.max_replicas), ("--gpus", self.gpus)):
            if v is not None and v < 1:
                raise BadInputError(f"bad {what}: must be at least 1")
        if self.replicas is not None and (self.min_replicas is not None or self.max_replicas is not None):
            raise BadInputError("--replicas fixes the scale and --min-replicas/--max-replicas ask for autoscaling: pick one")
        if self.autoscale_range[1] < self.autoscale_range[0]:
            raise BadInputError("--max-replicas is below --min-replicas")

        check_quantity(self.cpu, "--cpu")
        check_quantity(self.memory, "--memory", whole_units=True)
        if self.version is not None and (not isinstance(self.version, int) or isinstance(self.version, bool)):
            raise BadInputError(f"bad --version {self.version!r}: a whole number")
        if self.version is not None and self.version < 1:
            raise BadInputError("bad --version: versions start at 1")
        if self.model_name is not None:

            check_path_name(self.model_name, "--name")

    @property
    def autoscale_range(self) -> tuple[int, int]:
        """(min, max) replicas of an autoscaler: the flags', else 1 and 4 (a max below 1 is raised to min)."""
        low = self.min_replicas or 1
        return low, self.max_replicas or max(low, 4)

    @property
    def autoscaling_asked(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None


@dataclass
class Bundle:
    """What a packager wrote: the system, its root folder and files, and what a user needs to know."""

    system: str
    path: Path
    files: list[Path]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, root: Path | None = None) -> dict[str, Any]:

        return {"system": self.system, **describe_files(self.path, self.files, root), **self.details}


def get_packager(name: str) -> ModuleType:
    return PACKAGERS.load(name)


def parse_systems(text: str | list[str]) -> list[str]:
    """'triton,torchserve' (or a list) -> canonical names, in order, without repeats."""
    return PACKAGERS.names(text, hint="pass --for")
