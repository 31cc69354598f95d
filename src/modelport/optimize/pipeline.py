"""Running passes with a parity gate: after every pass that changed the model, the result is run
in onnxruntime on the reference inputs and compared with the reference outputs. A pass that
breaks parity (or fails, or produces a model onnxruntime cannot load) is rolled back and the
row says why; with `strict` the run fails instead (exit 4 for parity, the pass's own error
otherwise). Every pass yields one report row: nodes and size before/after, time, parity.

A precision pass (FP16, INT8) is what the user asked for, not an optional improvement: when it is
rolled back (after its own block-list fallback), `optimize_ir` fails with exit 4 naming the
figures and the nodes it kept in FP32, unless `allow_fallback` accepts the FP32 model (recorded
as `provenance["precision_fallback"]`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelport.errors import BadInputError, MissingDependencyError, ModelportError, PassError, ValidationError, one_line
from modelport.ir import IRModel
from modelport.onnxfile.proto_pieces import serialized_size
from modelport.onnxfile.tensor_sizes import iter_tensors, protobuf_limit, raw_nbytes, tensor_bytes
from modelport.onnxfile.weightless_copy import check_weightless, weightless
from modelport.optimize import LEVEL_NAMES, PRECISIONS, Pass, get_pass, parse_pass_list, passes_for_level
from modelport.optimize.calibration import load_calibration
from modelport.optimize.dequantize import before_float_passes
from modelport.optimize.model_tools import model_size, node_count, sort_nodes
from modelport.optimize.quantize import CALIBRATION_METHODS
from modelport.registry import choice
from modelport.run import memory
from modelport.run.memory import give_back
from modelport.runtimes import check_runtimes
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import Tolerance, check, tolerance_for
from modelport.validation.budget import BudgetKey, parse_clauses

PassCallback = Callable[[str], None]


# above this size of tensor data a model is hashed tensor by tensor: its serialisation would be one
# more copy of it (and protobuf cannot serialise past 2 GiB)
_INLINE_HASH_LIMIT = 64 << 20


def fingerprint(model, *, inline_limit: int = _INLINE_HASH_LIMIT) -> str:
    """sha256 of a ModelProto's deterministic serialisation. A model with more than `inline_limit`
    bytes of tensors is hashed as its graph without the large tensors' bytes (`weightless_copy.weightless`)
    followed by each of those tensors' own hash, one tensor in memory at a time; the model is only read."""
    import hashlib


    h = hashlib.sha256()
    if tensor_bytes(model) <= inline_limit:
        h.update(model.SerializeToString(deterministic=True))
        return h.hexdigest()
    skeleton, _ = weightless(model)
    h.update(skeleton.SerializeToString(deterministic=True))
    for t in _tensors(model):
        if raw_nbytes(t) >= 1024:
            h.update(hashlib.sha256(t.raw_data).digest())
    return h.hexdigest()


def _tensors(model):
    """Every TensorProto of a model: initializers and tensor attributes, subgraphs included."""
    from onnx import AttributeProto

    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        yield from g.initializer
        for node in g.node:
            for a in node.attribute:
                if a.type == AttributeProto.TENSOR:
                    yield a.t
                elif a.type == AttributeProto.TENSORS:
                    yield from a.tensors
                elif a.type == AttributeProto.GRAPH:
                    graphs.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    graphs.extend(a.graphs)


def check_parity(ir: IRModel, tol: Tolerance, hop: str, *, model_file: Path | None = None):
    """`ir` against its references in onnxruntime (every set, at every precision). A large model's weights wait in a file meanwhile,
    from which onnxruntime loads them (`IRModel.weights_parked`): the session and the ModelProto are
    not both held. `model_file`: `ir` written already, its weights beside it (a parked IR)."""

    with contextlib.nullcontext(model_file) if model_file is not None else ir.weights_parked() as parked:
        runner = OnnxRuntimeRunner(parked or ir.model)
        parity = check(runner, ir.reference, tol, hop)
        del runner  # the session, released and its memory handed back before any weights are read back:
        give_back()  # memory the allocator keeps is not always reused by the read (a 403 MB model's pass
        # peaked at 911 MB instead of 521 under a parallel disk write)
    return parity


def invalid_model(model, *, repair: bool = False) -> str | None:
    """Why onnx's checker refuses `model` (one line), or None.

    onnxruntime sorts a graph itself and so runs graphs that other consumers refuse; a pass that
    yields an invalid model is rolled back like one that breaks parity, before the result reaches
    an emitter. With `repair`, nodes merely out of topological order (as converters that append
    Cast nodes leave them) are sorted in place first: `model` must be the pass's own new model.
    """
    import onnx


    if repair:

        sort_nodes(model.graph)
    try:
        if tensor_bytes(model) > _INLINE_HASH_LIMIT or serialized_size(model) >= protobuf_limit() \
                or any(t.data_location == onnx.TensorProto.EXTERNAL for t in iter_tensors(model.graph)):
            # serialised, it would be one more copy of itself (or past protobuf's limit); the checker
            # looks for external data in the working directory
            check_weightless(model)
        else:
            onnx.checker.check_model(model)
    except Exception as e:
        return " ".join(str(e).split())[:300] or type(e).__name__
    return None


@dataclass
class PassRow:
    name: str
    status: str  # applied | unchanged | rolled_back | skipped
    nodes_before: int
    nodes_after: int
    size_before: int
    size_after: int
    seconds: float
    parity: dict | None = None
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    peak_rss: int | None = None  # the process tree's, while the pass and its parity check ran

    def to_dict(self) -> dict:
        out = {"name": f"optimize:{self.name}", "pass": self.name, "status": self.status,
               "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
               "size_before": self.size_before, "size_after": self.size_after,
               "seconds": round(self.seconds, 4), "parity": self.parity, "reason": self.reason or None,
               "details": self.details}
        if self.peak_rss:
            out["peak_rss"] = self.peak_rss
        return out

    def close(self, t0: float, window) -> None:
        """The pass's wall time and the process tree's peak RSS since `t0` / `window` opened."""
        self.seconds = time.perf_counter() - t0
        self.peak_rss = window.close() or None


def run_passes(ir: IRModel, passes: list[Pass], *, tolerance: Callable[[str], Tolerance] | None = None,
               strict: bool = False, on_pass: PassCallback | None = None,
               release_input: bool = False) -> tuple[IRModel, list[PassRow]]:
    """Apply `passes` in order through the parity gate; returns the final IR and one row per pass.

    A pass must not mutate the model it is given (rolling it back relies on that): the input is
    fingerprinted before the pass and checked after, and a pass that changed it fails the run
    with a PassError naming it, whatever `strict` says.

    A model with PARK_BYTES of weights keeps them in files while the passes that read them from
    there run (`Pass.reads_stored`, see `_Parking`): a pass's input and its result are graphs whose
    initializers refer to those files, so the weights are not held in memory by either, nor beside
    the parity check's session. `release_input`: the caller will not use `ir`'s model again, so its
    weights are not read back unless it is the result (its model is then None).
    """

    if ir.reference is None:
        raise BadInputError("the model has no reference data to check optimisation passes against")
    tolerance = tolerance or tolerance_for
    rows: list[PassRow] = []
    parking = _Parking(ir)
    try:
        for p in passes:
            if on_pass:
                on_pass(f"optimize:{p.name}")
            t0, window = time.perf_counter(), memory.window()
            try:
                ir = parking.ready(ir, p)
                nb, sb = node_count(ir.model), model_size(ir.model)
                row = PassRow(p.name, "unchanged", nb, nb, sb, sb, 0.0)
                ir = _run_pass(p, ir, row, rows, tolerance, strict, parking, t0, window)
            finally:
                window.close()
            row.close(t0, window)
            rows.append(row)
    except BaseException:
        parking.abandon()
        raise
    return parking.finish(ir, release_input=release_input), rows


def _run_pass(p: Pass, ir: IRModel, row: PassRow, rows: list[PassRow], tolerance, strict: bool, parking: _Parking,
              t0: float, window) -> IRModel:
    """One pass of `run_passes` through the gate, its outcome in `row`; returns the IR that goes on."""

    nb, sb = row.nodes_before, row.size_before
    before = fingerprint(ir.model)

    def fail(message: str, **details) -> ValidationError:
        row.close(t0, window)
        rows.append(row)
        return ValidationError(message, rows=rows, **details)

    p.gate_tolerance = tolerance(p.precision)
    try:
        try:
            result = p.apply(ir)
        finally:
            if fingerprint(ir.model) != before:
                raise PassError(p.name, [r.name for r in rows], "mutated the model it was given "
                                "(a pass must return a new model; its input is what a rollback restores)")
        row.details = result.details
        if result.model is ir or not result.modified:
            row.status = "skipped" if result.details.get("skipped") else "unchanged"
            row.reason = result.details.get("skipped", "")
        elif (invalid := invalid_model(result.model.model, repair=True)) is not None:
            row.status, row.reason = "rolled_back", f"invalid model: {invalid}"
            if strict:
                raise fail(f"pass '{p.name}' produced an invalid model: {invalid}")
        else:
            candidate, hop = result.model, f"optimize:{p.name}"
            if candidate.stored is not None:  # its weights are in files: its new tensors go beside them
                parity = check_parity(candidate, tolerance(p.precision), hop, model_file=parking.settle(candidate))
            else:
                with ir.weights_parked():  # the pass's input waits in a file too while the candidate is checked
                    parity = check_parity(candidate, tolerance(p.precision), hop)
            row.parity = parity.to_dict()
            row.nodes_after, row.size_after = node_count(candidate.model), model_size(candidate.model)
            if parity.ok:
                row.status = "applied"
                return candidate
            row.status, row.reason = "rolled_back", f"parity: {parity.summary()}"
            row.nodes_after, row.size_after = nb, sb
            if strict:
                raise fail(f"pass '{p.name}' broke parity: {parity.summary()}", parity=parity.to_dict())
    except (MissingDependencyError, PassError, ValidationError):
        raise
    except Exception as e:
        from modelport.deps import missing_dependency

        missing = missing_dependency(e)
        if missing is not None:  # a pass that cannot run is not a pass that broke parity
            raise missing from e
        reason = e.message if isinstance(e, ModelportError) else one_line(e, typed=True)
        row.status, row.reason = "rolled_back", f"error: {reason}"
        row.nodes_after, row.size_after = nb, sb
        if strict:
            raise fail(f"pass '{p.name}' failed: {reason}") from e
    return ir


class _Parking:
    """A run's weights in files while passes that read them from there run (`Pass.reads_stored`).

    Before such a pass, a model with PARK_BYTES of weights in memory is parked (`IRModel.park`) in
    a temporary folder of the run; the pass returns a graph that refers to the same files plus the
    tensors it made, and those are written beside them for its parity check (`settle`), the session
    loading the model from there. Before any other pass the current model's weights are read back.
    `finish` reads the result's weights back once, and the input's unless it is released; a failed
    run reads back the input's only. The folder goes with the run.

    On the 0.94 GB encoder of docs/benchmarks.md, `--optimize all` held its input, the IR the passes
    started from and each candidate in memory (4.1x the weights at the `transformer` pass's peak).
    """

    def __init__(self, first: IRModel):
        self.first = first
        self._dir = None
        self._count = 0

    def _place(self) -> tuple[Path, str]:
        import tempfile

        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="modelport-passes-")
        self._count += 1
        return Path(self._dir.name), f"m{self._count}.onnx"

    def ready(self, ir: IRModel, p: Pass) -> IRModel:
        """`ir` as `p` takes it: parked for a pass that reads stored weights (when large), in memory for any other."""
        from modelport.ir import PARK_BYTES

        if ir.stored is not None and (not p.reads_stored or not self._ours(ir)):
            ir.attach_stored()  # weights stored elsewhere (a parse's files) are read in, then parked here
        if p.reads_stored and ir.stored is None and ir.model is not None and not ir.parts \
                and tensor_bytes(ir.model) >= PARK_BYTES:
            ir.park(*self._place())
        return ir

    def _ours(self, ir: IRModel) -> bool:
        return self._dir is not None and ir.stored is not None and Path(ir.stored) == Path(self._dir.name)

    def settle(self, candidate: IRModel) -> Path:
        """`candidate` (a parked IR's successor) written beside the weights it refers to; returns its file."""
        return candidate.park(*self._place())

    def finish(self, out: IRModel, *, release_input: bool) -> IRModel:
        try:
            if self._ours(out):
                out.attach_stored()
            first = self.first
            if first is not out and self._ours(first):
                if release_input:
                    first.model, first.stored = None, None
                else:
                    first.attach_stored()
        finally:
            self._close()
        return out

    def abandon(self) -> None:
        try:
            if self._ours(self.first):
                self.first.attach_stored()
        finally:
            self._close()

    def _close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


@dataclass(frozen=True)
class OptimizeOptions:
    """The optimisation stage's options, declared and validated once (`optimize` and `convert --optimize`)."""

    level: str | None = "extended"  # a LEVELS name, "auto", or None with `passes`
    passes: list[str] | None = None
    precision: str = "fp32"  # fp32 | fp16 | int8
    int8_mode: str | None = None  # dynamic | static (default: static when calibration is given)
    calibration: str | None = None
    calibration_method: str = "minmax"
    per_channel: bool | None = None
    keep_io_types: bool = True
    budget: Tolerance | None = None
    strict: bool = False
    allow_fallback: bool = False  # accept FP32 when the requested precision cannot hold parity
    bench_runs: int = 20
    runtimes: tuple[str, ...] | None = None  # auto: the CPU runtimes whose candidates compete (default: onnxruntime)
    timer: Callable | None = None  # auto: timer(candidate row, run) -> ms; default: medians of bench_runs interleaved rounds
    threads: int | None = None  # auto: intra-op threads the candidates are timed with (None: each runtime's default)

    def __post_init__(self):

        def put(name, value):
            object.__setattr__(self, name, value)

        if isinstance(self.passes, str):
            put("passes", parse_pass_list(self.passes))
        put("level", choice(self.level, LEVEL_NAMES, "optimisation level"))
        if str(self.precision).strip().lower() not in PRECISIONS:
            raise BadInputError(f"unknown precision '{self.precision}'; known: fp32, fp16, int8")
        put("precision", self.precision.strip().lower())
        if self.precision.startswith("int8-"):
            put("int8_mode", self.precision[5:])
            put("precision", "int8")
        put("int8_mode", choice(self.int8_mode, ("dynamic", "static"), "INT8 mode"))
        put("calibration_method", choice(self.calibration_method, CALIBRATION_METHODS, "calibration method"))
        if isinstance(self.budget, str):
            put("budget", parse_budget(self.budget))
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1):
            raise BadInputError(f"threads must be a positive whole number, not {self.threads!r}")
        if self.runtimes is not None:

            put("runtimes", check_runtimes(self.runtimes))


PIPELINE_BUDGET_KEYS = (BudgetKey("cosine", ">=", ("cos",)), BudgetKey("max_abs", "<=", ("atol", "abs")))


def parse_budget(text: str) -> Tolerance:
    """`cosine>=0.999`, `max_abs<=0.01`, or both comma-separated, as a Tolerance."""
    values = parse_clauses(text, PIPELINE_BUDGET_KEYS, f"bad --accuracy-budget '{text}': use cosine>=0.999 and/or max_abs<=0.01")
    atol = values.get("max_abs", float("inf"))
    return Tolerance(atol=atol, rtol=0.0 if "max_abs" in values else float("inf"), min_cosine=values.get("cosine", 0.0),
                     scaled=False)


def build_passes(opts: OptimizeOptions, *, with_precision: bool = True, calibration: list[dict] | None = None) -> list[Pass]:
    """The passes `opts` names; `int8-static` gets `calibration` (loaded feeds) at construction."""
    names = list(opts.passes) if opts.passes else passes_for_level(opts.level or "none")
    passes = [get_pass(n, calibration=calibration) if n == "int8-static" and calibration is not None else get_pass(n)
              for n in names]
    if with_precision:
        passes += precision_passes(opts, calibration=calibration)
    return passes


def precision_passes(opts: OptimizeOptions, *, calibration: list[dict] | None = None) -> list[Pass]:
    if opts.precision == "fp16":
        return [get_pass("fp16", keep_io_types=opts.keep_io_types)]
    if opts.precision == "int8":
        mode = opts.int8_mode or ("static" if opts.calibration else "dynamic")
        if mode == "static":
            return [get_pass("int8-static", calibration=calibration, method=opts.calibration_method,
                             per_channel=opts.per_channel)]
        return [get_pass("int8-dynamic", per_channel=bool(opts.per_channel))]
    return []


def optimize_ir(ir: IRModel, opts: OptimizeOptions, *, tolerance: Callable[[str], Tolerance] | None = None,
                on_pass: PassCallback | None = None, release_input: bool = False) -> tuple[IRModel, list[dict], dict | None]:
    """Optimise `ir` with the passes of `opts` (a level other than auto, or named passes); returns
    (IR, report rows, None). `--optimize auto` is `optimize.auto.auto_select`, which calls this.
    A quantised IR's weights are dequantised before the first pass that takes float weights
    (`optimize/dequantize.py`). `release_input`: see `run_passes`."""
    if opts.budget is not None:
        budget = opts.budget
        tolerance = budgeted(tolerance, budget)
    if opts.level == "auto" and not opts.passes:
        raise ValueError("level 'auto' compares variants: call optimize.auto.auto_select")
    passes = build_passes(opts)
    if opts.precision == "int8" and (opts.int8_mode == "static") and not opts.calibration:
        raise BadInputError("static INT8 quantisation needs calibration data", hint="pass --calibration DATA.npz or an image folder")
    if any(p.name == "int8-static" for p in passes):

        passes = build_passes(opts, calibration=load_calibration(opts.calibration, ir))
    passes = before_float_passes(passes, ir.model)
    out, rows = run_passes(ir, passes, tolerance=tolerance, strict=opts.strict, on_pass=on_pass, release_input=release_input)
    out = _check_delivered(out, passes, rows, opts)
    return out, [r.to_dict() for r in rows], None


def _check_delivered(out: IRModel, passes: list[Pass], rows: list[PassRow], opts: OptimizeOptions) -> IRModel:
    """The requested precision came out, or exit 4 naming why (unless a fallback is allowed)."""
    failed = [(p, r) for p, r in zip(passes, rows, strict=True) if p.precision != "fp32" and r.status != "applied"]
    if not failed:
        return out
    p, row = failed[0]
    requested = opts.precision if opts.precision != "fp32" else p.precision  # `--passes fp16` asks for it too
    kept = row.details.get("kept_fp32") or []
    why = f"pass '{p.name}' {row.status.replace('_', ' ')}: {row.reason or 'no change'}"
    if kept:
        why += f"; nodes kept in FP32: {', '.join(kept[:10])}" + (f" (+{len(kept) - 10} more)" if len(kept) > 10 else "")
    gave_up = (row.details.get("fallback") or {}).get("gave_up")
    if gave_up:
        why += f"; {gave_up}"
    if not opts.allow_fallback:
        raise ValidationError(f"--precision {requested} cannot be delivered within tolerance: {why} "
                              "(--allow-precision-fallback accepts an FP32 model instead)", parity=row.parity, rows=rows)
    out = out.clone(out.model)
    out.provenance["precision_fallback"] = {"requested": requested, "reason": why}
    return out


def budgeted(tolerance, budget: Tolerance):
    """FP32 passes keep their own tolerance; precision passes are held to the user's budget."""

    def tol(precision: str) -> Tolerance:
        if precision == "fp32":
            return tolerance("fp32") if tolerance else tolerance_for("fp32")
        return budget

    return tol
