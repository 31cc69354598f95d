"""Build a TensorRT engine from the plan in this folder (plan.json + model.onnx).

This file is copied as `tensorrt/build_engine.py` next to every TensorRT artifact and needs
only the standard library and `tensorrt` (plus `torch` or `nvidia-smi` to read the GPU's compute
capability). It is also what modelport itself runs to build, so the engine built here and the
one built on the serving machine come from the same code.

    python build_engine.py            # build when the engine is missing or was built for another GPU/TensorRT
    python build_engine.py --force    # rebuild
    python build_engine.py --check    # exit 0 when the engine matches this machine, 3 when it must be rebuilt

Engines are not portable across GPU architectures or TensorRT versions: `engine.json` records
both, and a mismatch rebuilds instead of failing to deserialize.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gpu_info() -> dict:
    """{'name', 'compute_capability'} of GPU 0, from torch or nvidia-smi; {} when none is visible."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return {"name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}"}
    except ImportError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    name, _, cap = out[0].rpartition(",")
    return {"name": name.strip(), "compute_capability": cap.strip()}


def load_plan(folder: Path = HERE) -> dict:
    return json.loads((folder / "plan.json").read_text())


def engine_path(plan: dict, folder: Path = HERE) -> Path:
    return (folder / plan["engine"]).resolve()


def mismatch(folder: Path = HERE) -> str | None:
    """Why the engine cannot be used on this machine, or None when it matches."""
    import tensorrt as trt

    plan = load_plan(folder)
    engine = engine_path(plan, folder)
    meta_path = folder / "engine.json"
    if not engine.exists() or not meta_path.exists():
        return "no engine built yet"
    meta = json.loads(meta_path.read_text())
    gpu = gpu_info()
    if meta.get("tensorrt") != trt.__version__:
        return f"engine built with TensorRT {meta.get('tensorrt')}, this machine has {trt.__version__}"
    if gpu.get("compute_capability") != meta.get("compute_capability"):
        return (f"engine built for compute capability {meta.get('compute_capability')} ({meta.get('gpu')}), "
                f"this GPU is {gpu.get('compute_capability')} ({gpu.get('name')})")
    if hashlib.sha256(engine.read_bytes()).hexdigest() != meta.get("sha256"):
        return "engine file differs from the one recorded"
    return None


def build(folder: Path = HERE, log=print) -> Path:
    """Build the engine the plan describes; returns its path. Raises RuntimeError with the parser's errors."""
    import tensorrt as trt

    plan = load_plan(folder)
    major = int(trt.__version__.split(".")[0])
    precision = plan["precision"]
    onnx_name = plan["onnx"]
    if major >= 11 and precision in ("fp16", "best") and plan.get("onnx_fp16"):
        onnx_name = plan["onnx_fp16"]  # strongly typed: precision lives in the graph
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if major >= 11 and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(folder / onnx_name)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError(f"TensorRT's ONNX parser rejected {onnx_name}: " + "; ".join(errors))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(plan["workspace_mib"]) << 20)
    if major < 11 and precision in ("fp16", "best"):
        config.set_flag(trt.BuilderFlag.FP16)
    inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    dynamic = [p for p in plan["profiles"] if p["min"] != p["max"]]
    if dynamic:
        profile = builder.create_optimization_profile()
        for p in dynamic:
            if p["name"] not in inputs:
                raise RuntimeError(f"profile names '{p['name']}', the network's inputs are {sorted(inputs)}")
            profile.set_shape(p["name"], p["min"], p["opt"], p["max"])
        config.add_optimization_profile(profile)
    cache_path = folder / plan.get("timing_cache", "timing.cache")
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=True)
    log(f"building {engine_path(plan, folder).name} from {onnx_name} with TensorRT {trt.__version__} ({precision})")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT could not build the engine (see the log above)")
    data = bytes(serialized)
    engine = engine_path(plan, folder)
    engine.write_bytes(data)
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    gpu = gpu_info()
    meta = {"tensorrt": trt.__version__, "gpu": gpu.get("name"), "compute_capability": gpu.get("compute_capability"),
            "precision": precision, "onnx": onnx_name, "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "engine.json").write_text(json.dumps(meta, indent=2) + "\n")
    return engine


def ensure_engine(folder: Path = HERE, *, force: bool = False, log=print) -> Path:
    """The engine path, rebuilt first when missing, forced, or built for another GPU/TensorRT."""
    reason = "forced" if force else mismatch(folder)
    if reason:
        log(f"rebuilding: {reason}")
        return build(folder, log=log)
    return engine_path(load_plan(folder), folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Build the TensorRT engine described by plan.json.")
    ap.add_argument("--force", action="store_true", help="rebuild even when the engine matches")
    ap.add_argument("--check", action="store_true", help="only report whether the engine matches this machine")
    args = ap.parse_args(argv)
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        print("tensorrt is not installed (pip install tensorrt, on a machine with an NVIDIA GPU)", file=sys.stderr)
        return 5
    if args.check:
        reason = mismatch()
        print(reason or "engine matches this machine")
        return 3 if reason else 0
    try:
        path = ensure_engine(force=args.force)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(os.path.relpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
