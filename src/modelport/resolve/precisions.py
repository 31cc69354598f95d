"""The precision of each requested target's artifact: one resolver, which every stage asks.

The rule, for one target or several:

- Each target keeps its own default (its descriptor's first precision for the task: fp16 for
  Core ML, fp32 for the others) unless `--precision` is given.
- A given `--precision` applies to every target; one that a target does not take is exit 2 before
  any work, naming the target and what it takes.
- A task with a pipeline of its own (text-generation) has its own precisions per target
  (`Target.tasks`); a target that writes no model of the task is exit 2 naming those that do.

For each target the answer also says which stage applies the precision (`stage`): "optimize",
the IR's precision passes, run once per precision on the optimised IR and shared by every target
that takes the IR at that precision (onnx, ort; a decoder's weight-only quantiser); "emit", the
target's own converter (TFLite, OpenVINO, Core ML, …); "none" for fp32. And the precision whose
tolerance its artifact is judged with (`judged_as`: TensorRT's `best` mixes fp16 and fp32
kernels, judged as fp16). Nothing else decides a precision: the optimisation stage, the emitters,
the validation and the report read these answers. docs/precisions.md is this module's table
(`python -m modelport.resolve.precisions` writes it; a test keeps it current).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from modelport.errors import BadInputError
from modelport.targets import TARGETS, Target, emitting, get

FP32 = "fp32"
AUTO = "auto"  # --optimize auto picks the precision among its variants (decoder LMs)


@dataclass(frozen=True)
class Resolved:
    """What one target's artifact is made at."""

    target: str
    precision: str
    asked: bool  # given by --precision (False: the target's default)
    stage: str  # "optimize" | "emit" | "none"
    judged_as: str  # the precision of the tolerance its artifact is judged with

    def to_dict(self) -> dict:
        return {"target": self.target, "precision": self.precision, "asked": self.asked, "stage": self.stage,
                "judged_as": self.judged_as}


def pipeline_tasks() -> set[str]:
    """The tasks with a pipeline of their own (some target's `tasks` names them): text-generation."""
    return {k for t in TARGETS.values() for k in t.tasks}


def takes(target: Target, task: str | None = None) -> tuple[str, ...]:
    """The precisions `target` takes for models of `task`, its default first: its `tasks` entry for a
    task with a pipeline of its own (none when it has no entry), else its `precisions`."""
    if task in target.tasks:
        return target.tasks[task]
    return () if task in pipeline_tasks() else target.precisions


def all_precisions() -> tuple[str, ...]:
    """Every --precision some target takes for some task, in table order: the choice list of convert and emit."""
    out: list[str] = []
    for t in emitting():
        for task in (None, *t.tasks):
            out += [p for p in takes(t, task) if p not in out]
    return tuple(out)


def resolve(targets: Iterable[str], precision: str | None = None, task: str | None = None) -> dict[str, Resolved]:
    """{target name: Resolved} for the requested targets (names or aliases), in their order; exit 2
    when a target writes no model of `task` or does not take the given precision."""
    chosen = [get(str(name)) for name in targets]
    _check_task(chosen, task)
    out = {}
    for t in chosen:
        taken = takes(t, task)
        if precision is not None and precision not in taken:
            raise _refusal(t, precision, task)
        p = precision if precision is not None else taken[0]
        stage = "none" if p == FP32 else t.precision_stage
        out[t.name] = Resolved(t.name, p, precision is not None, stage, t.judged_as.get(p, p))
    return out


def _check_task(chosen: list[Target], task: str | None) -> None:
    bad = [t.name for t in chosen if not takes(t, task)]
    if not bad:
        return
    if task in pipeline_tasks():
        serving = [t.name for t in emitting() if takes(t, task)]
        raise BadInputError(f"--task {task} writes {', '.join(serving)}; not {', '.join(bad)}")
    tasks = sorted({k for t in chosen if t.name in bad for k in t.tasks})
    raise BadInputError(f"the {', '.join(bad)} target writes models of --task {' or '.join(tasks)} only",
                        hint=f"convert a model of that task with --task {tasks[0]}" if tasks else None)


def _refusal(t: Target, precision: str, task: str | None) -> BadInputError:
    if task in pipeline_tasks():
        taken = sorted({p for x in emitting() for p in takes(x, task)}, key=all_precisions().index)
        return BadInputError(f"--task {task} takes --precision {', '.join(taken[:-1])} or {taken[-1]}; not {precision}")
    other = [k for k, ps in t.tasks.items() if precision in ps]
    if other:
        picked = " --optimize auto (for other models --optimize auto compares precisions itself)" if precision == AUTO else ""
        return BadInputError(f"--precision {precision} is for --task {' or '.join(other)}{picked}",
                             hint=f"add --task {other[0]}, or convert with --precision {t.precisions[0]}"
                             if t.precisions else None)
    taken = takes(t, task)
    said = f"is {taken[0]} only" if len(taken) == 1 else f"takes --precision {', '.join(taken)}"
    return BadInputError(f"the {t.name} target {said}, not {precision}",
                         hint=t.refused.get(precision) or f"convert with --precision {taken[0]}")


def table() -> list[dict]:
    """One row per (target, task): what it takes, its default and the stage that applies a precision."""
    rows = []
    for t in emitting():
        for task in (None, *t.tasks):
            taken = takes(t, task)
            if not taken:
                continue
            rows.append({"target": t.name, "task": task or "(any other)", "precisions": list(taken), "default": taken[0],
                         "stage": t.precision_stage, "judged_as": dict(t.judged_as)})
    return rows


def markdown() -> str:
    """docs/precisions.md: the rule and the table, from the descriptors."""
    lines = [
        "# Precisions per target",
        "",
        "Generated from `src/modelport/targets.py` by `python -m modelport.resolve.precisions` (a test keeps it current).",
        "",
        "The rule: each target keeps its own default (the first precision below) unless `--precision` is given; a given",
        "`--precision` applies to every target, and one that a target does not take is exit 2 before any work.",
        "`--to coreml,onnx` therefore writes an fp16 Core ML package and an fp32 ONNX model; `--precision fp16` makes both",
        "fp16. *optimize*: the IR's precision passes apply it (once per precision, checked for parity, with the FP16",
        "block-list and `--allow-precision-fallback`), and every target of that stage shares the result; *emit*: the",
        "target's own converter applies it. `report.json` records each artifact's `precision` and `requested_precision`.",
        "",
        "| target | task | precisions (default first) | applied by | judged as |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in table():
        judged = ", ".join(f"{k} as {v}" for k, v in r["judged_as"].items()) or "itself"
        lines.append(f"| {r['target']} | {r['task']} | {', '.join(r['precisions'])} | {r['stage']} | {judged} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "docs" / "precisions.md"
    target.write_text(markdown())
    print(f"wrote {target}")
