"""`modelport doctor`: versions, extras, runtimes, hardware, and what each target still needs."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import print_rows, run


def print_doctor(d: dict) -> None:
    rows = [["modelport", d["modelport"], ""], ["python", d["python"], d["executable"]], ["platform", d["platform"], ""]]
    for e in d["extras"]:
        rows.append([f"extra {e['name']}", "installed" if e["installed"] else "missing",
                     "" if e["installed"] else "needs " + ", ".join(e["missing"]) + f'  (pip install "modelport[{e["name"]}]")'])
    for dist, version in d["packages"].items():
        rows.append([dist, version, ""])
    providers = d["onnxruntime_providers"]
    rows.append(["onnxruntime providers", ", ".join(providers) if providers else "-", ""])
    gpu = d["gpu"]
    rows.append(["gpu", ", ".join(g.get("name", "?") for g in gpu["gpus"]) or "none", "nvidia-smi: " + (gpu["nvidia_smi"] or "not found")])
    for name, version in gpu["runtimes"].items():
        rows.append([f"{name} (GPU)", version or "not installed", ""])
    cpu = d["cpu"]
    features = [k.upper() if k != "avx512" else "AVX-512" for k, on in cpu["features"].items() if on]
    rows.append(["cpu", cpu["model"] or cpu["machine"], f"{cpu['cores']} cores; " + (", ".join(features) or "no AVX2")])
    for kind in ("targets", "sources"):
        for t in d[kind]:
            state = "ready" if t["ready"] else ("not checked" if t["ready"] is None else "missing " + ", ".join(t["missing"]))
            hint = "".join(f'pip install "modelport[{x}]"' for x in t["install"][:1]) + (" …" if len(t["install"]) > 1 else "")
            if t.get("runs_here") is False:
                state = "build only" if t["ready"] else state
                hint = "; ".join(x for x in (hint, t["note"]) if x)
            rows.append([f"{'--to' if kind == 'targets' else '--from'} {t['name']}", state, hint])
    print_rows("modelport doctor", ["item", "state", "details"], rows)


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(json_out: flags.JsonOut = False, quiet: flags.Quiet = False):
        """Show versions, extras, runtimes and execution providers, GPU/TensorRT, CPU features, and what each target needs."""

        def body():
            from modelport.orchestration.doctor import doctor

            return doctor()

        run(body, command="doctor", json_out=json_out, quiet=quiet, print_result=print_doctor)
