"""`validate A B`: run two models on the same inputs and compare, optionally naming the first diverging node.

Any file a runner here can run is accepted: `.onnx`/`.ort` (onnxruntime), `.tflite` (LiteRT),
`.plan`/`.engine` (TensorRT, on a GPU), an emitted `pytorch/` folder (torch, with `--trust`: it
imports the folder's model.py); and any source a parser reads (`.pt2`, `.keras`/`.h5`, a
SavedModel, a frozen `.pb`), run by its own framework through the parser, exactly as `convert`
computes its references. Inputs are generated from A's input specs (the same
deterministic samples `convert` uses) or read from an `.npz`. When one side is a TFLite model
whose inputs or outputs are the channels-last form of the other side's, they are transposed so
both see the same data. A mismatch is a ValidationError (exit 4): usable as a CI gate.

Localisation (`localize=True`) needs intermediate tensors from both sides under the same names:
that holds for two ONNX variants of one graph (optimised, FP16, quantised), not for TFLite files
written by onnx2tf, whose tensors carry TensorFlow names.

Each kind of file is opened by the runner registered in KINDS, which also gives its input specs.
A `.tflite` given here is the user's file, not one this program just wrote: it is described and
run in a child process with a timeout (`runtimes.tflite.open_untrusted`), so a flatbuffer that crashes the
interpreter ends the run with exit 2 naming the signal instead of killing it. Quantised
(int8/uint8) TFLite inputs are fed floats that the runner quantises; the report's `b.io` (or
`a.io`) says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, ValidationError
from modelport.ir import Reference, TensorSpec
from modelport.onnxfile.onnx_io import load_onnx
from modelport.orchestration.bench import open_artifact
from modelport.parsers import detect, parse
from modelport.reference.input_roles import apply_roles, controls, guessed_inputs
from modelport.reference.sample_sets import reference_samples
from modelport.reference.samples import load_data, make_inputs, parse_values, run_reference
from modelport.registry import from_targets
from modelport.resolve.specs import SourceSpec
from modelport.run.file_checks import check_model_file
from modelport.runtimes import RUNNERS, runner_class
from modelport.validation import Tolerance, check_override_names, compare, tolerance_for
from modelport.validation.artifact import check_contract
from modelport.validation.compare import amplitude, conditioning, merge_samples, run_sets
from modelport.validation.localize import localize_runners
from modelport.validation.report import Findings, Run, Sides

# what `validate` runs: kind -> "module:function" opening a user's file as a runner (with
# `input_specs()` and `run(feeds)`); `suffixes` pick the kind by file name. Both come from the
# targets' descriptors (`modelport.targets`: opener, suffixes).
KINDS = from_targets("model kind", lambda t: t.opener, suffixes=True)
register_kind = KINDS.register


def kind_of(path: Path) -> str:
    """A runnable kind of KINDS, `pytorch_code` (an emitted pytorch/ folder), or `source:FRAMEWORK`
    (any other model a parser reads: .pt2, .keras, a SavedModel, ...)."""
    if path.is_dir() and ((path / "model.py").is_file() or (path / "pytorch" / "model.py").is_file()):
        return "pytorch_code"
    kind = KINDS.name_for(path)
    if kind is not None:
        return kind

    try:
        return "source:" + detect(path)
    except BadInputError:
        raise BadInputError(f"cannot run this kind of file; known: {', '.join(sorted(KINDS.suffixes))}, a pytorch/ folder, "
                            "or a source a parser reads (.pt2, .keras, .h5, SavedModel, .pb)", path=path) from None


class _Side:
    """One model of the pair: a runner, or a source its parser runs in its own framework (the
    references `convert` would compute, on the inputs given here)."""

    def __init__(self, path: Path, kind: str, *, trust: bool, inputs: list, dims: dict, seed: int):
        self.path, self.kind, self.trust, self.inputs, self.dims, self.seed = path, kind, trust, inputs, dims, seed
        self.runner = None
        if kind == "pytorch_code":

            self.runner = open_artifact(path, trust=trust)[0]
        elif not kind.startswith("source:"):
            self.runner = KINDS.load(kind)(path)

    def parse(self, given: dict):

        spec = SourceSpec(path=self.path, framework=self.kind.split(":", 1)[1], inputs=list(self.inputs), trust=self.trust,
                          sample_dims=dict(self.dims), seed=self.seed, given=dict(given))
        return parse(str(self.path), spec)

    def io_note(self):
        return self.runner.io_note() if self.runner is not None else None

    def cannot_run(self) -> str | None:
        """Why this side's runtime cannot run here (its runner says: `cannot_run`), else None."""
        return self.runner.cannot_run() if self.runner is not None else None


def _align_outputs(a: dict, b: dict) -> dict:
    """B's outputs, transposed channels-last -> channels-first where that is what makes them match A's."""
    pairs = list(zip(a.items(), b.items(), strict=False)) if set(a) != set(b) else [((k, a[k]), (k, b[k])) for k in a]
    out = {}
    for (_, ra), (kb, vb) in pairs:
        if vb.ndim >= 3 and vb.shape != ra.shape:
            perm = [0, vb.ndim - 1, *range(1, vb.ndim - 1)]
            if tuple(vb.shape[i] for i in perm) == ra.shape:
                vb = np.transpose(vb, perm)
        out[kb] = vb
    return {**b, **out}


def validate_models(a: str | Path, b: str | Path, *, data: str | Path | None = None, values: list[str] = (), dims: dict[str, int] | None = None,
                    seed: int = 0, tolerance: Tolerance | None = None, precision: str = "fp32",
                    localize: bool = False, by_position: bool = False, inputs: list = (), trust: bool = False,
                    on_stage=None, sampling: dict | None = None, strict: bool = False) -> dict:
    """Compare B against A on the same inputs; returns the report, raises ValidationError on a mismatch.

    Either side may be a source a parser reads (`inputs` are its `--input` specs; `trust` lets it
    run code, and allows an emitted pytorch/ folder's model.py). Both are run on every sample set
    (`sample_sets.sample_sets`, `sampling` its options) where B is a runner; a source as B is parsed
    on the first set only. A side whose runtime cannot run here (a Core ML package off macOS) is
    checked without running (`check_without_running`); `strict` then fails the run (exit 4)."""

    def stage(name: str) -> None:
        if on_stage:
            on_stage(name)

    pa, pb = check_model_file(a), check_model_file(b)
    ka, kb = kind_of(pa), kind_of(pb)
    if inputs and not (ka.startswith("source:") or kb.startswith("source:")):
        raise BadInputError("--input describes a source model's inputs; for two runnable models size dims with --dim")
    sa, sb = (_Side(p, k, trust=trust, inputs=inputs, dims=dims or {}, seed=seed) for p, k in ((pa, ka), (pb, kb)))
    given = {**(load_data(data) if data else {}), **parse_values(list(values))}
    idle = [side for side in (sa, sb) if side.cannot_run()]
    if idle:
        if len(idle) == 2:
            raise BadInputError(f"neither model can run here ({sa.cannot_run()})", path=pa)
        return check_without_running(sa, sb, given=given, seed=seed, strict=strict, on_stage=on_stage)
    tol = tolerance or tolerance_for(precision)
    stage(f"run:{pa.name} ({ka})")
    if sa.runner is not None:
        specs = sa.runner.input_specs()
        keep = _roles(pa, specs, given)
        feeds = make_inputs(specs, dims or {}, seed=seed, given=given, path=data or pa)
        out_a = run_reference(sa.runner.run, feeds, specs, given, pa)
        extra = reference_samples(sa.runner.run, specs, feeds, out_a, dims or {}, seed=seed, given=given, path=data or pa,
                                  keep=keep, **(sampling or {}))[1]
        reference = Reference(feeds, out_a, extra=extra, guessed=guessed_inputs(specs, given))
    else:
        reference = sa.parse(given).reference
        feeds, out_a = dict(reference.inputs), dict(reference.outputs)
    sets = reference.sets() if sb.runner is not None else reference.sets()[:1]
    stage(f"run:{pb.name} ({kb})")
    outs_b = run_sets(sb.runner, [x.inputs for x in sets]) if sb.runner is not None else [dict(sb.parse(feeds).reference.outputs)]
    if not by_position:

        check_override_names(tol, list(out_a), path=pa)
    hop = f"{pa.name} ({ka}) vs {pb.name} ({kb})"
    ill = {x.kind: why for x in sets if (why := conditioning(x, tol, hop))}
    parity = merge_samples([compare(x.outputs, _align_outputs(x.outputs, o), tol, hop=hop, by_position=by_position,
                                    floor=amplitude(x))
                            for x, o in zip(sets, outs_b, strict=True)], [x.kind for x in sets], ill)
    parity.guessed = list(reference.guessed)
    side_a, side_b = {"path": str(pa), "kind": ka}, {"path": str(pb), "kind": kb}
    for side, r in ((side_a, sa), (side_b, sb)):
        note = r.io_note()
        if note:
            side["io"] = note

    with Run("validate") as report:  # modelport.report/1, with the two sides under `a` and `b`
        where = {}
        if localize:
            stage("localize")
            where = localize_divergence(sa, sb, feeds) if not parity.ok else {"node": None, "note": "outputs match"}
        report.record(Findings(source={"path": str(pa), "framework": ka, "format": ka}, parity=[parity.to_dict()],
                               sides=Sides(side_a, side_b, {k: list(v.shape) for k, v in feeds.items()}),
                               localize=where if localize else None))
        if not parity.ok:
            named = not by_position and any(o.name == "*" for o in parity.outputs)
            reason = f"models differ: {parity.summary()}"
            if where.get("node"):
                reason += f"; first diverging node: {where['node']} ({where['op_type']}, tensor '{where['tensor']}')"
            raise ValidationError(reason, path=pb, parity=parity.to_dict(),
                                  hint="--match-by-position pairs the outputs in order" if named else parity.hint())
    return report.to_dict()


def _roles(path: Path, specs: list, given: dict) -> set[str]:
    """An ONNX file's input roles read from its graph (`input_roles.py`) applied to `specs`: the
    inputs structured sample sets keep. Other kinds: none."""
    if path.suffix.lower() != ".onnx":
        return set()

    return controls(apply_roles(specs, load_onnx(path, weights=False), given), specs)


def check_without_running(sa: _Side, sb: _Side, *, given: dict, seed: int, strict: bool, on_stage=None) -> dict:
    """One side cannot run here: its inputs and outputs, as its file describes them, against the
    other side's. Inputs: the names, dtypes and ranks the other side takes, each fixed dim kept.
    Outputs: the other side is run at the input sizes the file takes, and the file must give the
    same names, dtypes and shapes. The report says `validated: false` with the reason and warns;
    a mismatch is exit 4, and so is the unvalidated result under `strict`."""
    from types import SimpleNamespace


    idle, ref = (sa, sb) if sa.cannot_run() else (sb, sa)
    reason = idle.cannot_run()
    if on_stage:
        on_stage(f"read:{idle.path.name} ({idle.kind})")
    described = idle.runner.input_specs()
    info = idle.runner.describe()
    artifact = SimpleNamespace(path=idle.path, target=idle.kind, details={"io_dtypes": (info or {}).get("io_dtypes") or {}})
    if ref.runner is not None:
        ref_inputs = ref.runner.input_specs()
    else:
        ref_inputs = ref.parse(given).inputs
    by_name = {s.name: s for s in described}
    dims = {}
    for spec in ref_inputs:
        got = by_name.get(spec.name)
        if got is not None and len(got.shape) == len(spec.shape):
            dims.update({d: int(n) for d, n in zip(spec.shape, got.shape, strict=True) if isinstance(d, str) and isinstance(n, int)})
    contract = SimpleNamespace(inputs=ref_inputs, outputs=[])
    check_contract(SimpleNamespace(input_specs=lambda: described, output_specs=lambda: None), contract, artifact)  # the inputs first: they size the run below
    if on_stage:
        on_stage(f"run:{ref.path.name} ({ref.kind})")
    feeds = make_inputs(ref_inputs, dims, seed=seed, given=given, path=ref.path)
    outputs = ref.runner.run(feeds) if ref.runner is not None else dict(ref.parse(feeds).reference.outputs)
    contract.outputs = [TensorSpec(name, dtype=str(v.dtype), shape=list(v.shape)) for name, v in outputs.items()]
    checked = check_contract(idle.runner, contract, artifact)
    checked["outputs"] = f"names, dtypes and shapes as {ref.path.name}'s, run at the input sizes the file takes"
    with Run("validate") as report:
        side_idle = {"path": str(idle.path), "kind": idle.kind, "validated": False, "not_validated": reason, "contract_check": checked}
        side_ref = {"path": str(ref.path), "kind": ref.kind}
        a, b = (side_idle, side_ref) if idle is sa else (side_ref, side_idle)
        text = (f"{idle.path.name} is not validated here: {reason}; its inputs and outputs match {ref.path.name}'s "
                "(names, dtypes, shapes), nothing was run")
        report.record(Findings(source={"path": str(sa.path), "framework": sa.kind, "format": sa.kind},
                               sides=Sides(a, b, {k: list(v.shape) for k, v in feeds.items()}),
                               warnings=[] if strict else [text]))
        if strict:
            raise ValidationError(f"{text} (--strict: the models must be compared)", path=idle.path,
                                  hint="validate it where its runtime runs")
    return report.to_dict()


def localize_divergence(a: _Side, b: _Side, feeds: dict) -> dict:
    """The first tensor where B departs from A, when both sides' runners declare the `localize`
    ability (runtimes/base.py: onnxruntime for ONNX files, OpenVINO, in any pairing)."""

    runners = [side.runner for side in (a, b)]
    if all(r is not None and r.capabilities.localize for r in runners):
        return localize_runners(*runners, feeds)
    able = [name for name in RUNNERS if runner_class(name).capabilities.localize]
    return {"node": None, "note": f"localisation needs intermediate tensors under the same names on both sides; "
                                  f"{a.kind} vs {b.kind} does not provide that (supported: ONNX files and the models "
                                  f"{' and '.join(able)} run, in any pairing)"}
