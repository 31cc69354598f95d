"""INT8 that holds: the quantised nodes that break parity are kept in float, the worst first.

When the INT8 model misses its tolerance on a sample set (a letterbox-grey frame, silence, an
end of the input range), each quantised node's share of the error is measured and the worst
are kept in float until the tolerance holds on every set. The idea is NNCF's accuracy-controlled
quantisation (`nncf.quantize_with_accuracy_control`): rank the quantised operations by their
contribution to the accuracy drop, measured by reverting each to float on the samples where the
drop shows; revert the worst, validate on everything, go on; a revert that does not help is undone.

Error: for each output on each sample set where INT8 missed, e = 1 − cosine of the model
quantised with the nodes S kept in float against the reference (what INT8's tolerance judges;
half the relative squared error ‖q − r‖²/‖r‖² while the noise is small, and bounded where it is
not: an output rounded to 0 and a noisy one are both far from the reference, and the noisy one
is nearer); E(S) is the mean of e(S)/e(∅) over those, so the first INT8 model's E is 1 and a grey
frame missed by far does not drown a random set missed by a little. A node's share is the part
of that 1 that keeping it in float removed.

Units, what is kept in float together: each quantised node; and each quantised activation tensor's
quantised producer and consumers (a QDQ model puts one Quantize/Dequantize pair on a tensor for
every node that touches it, so keeping one consumer in float leaves the rounding in place).

Every trial is onnxruntime's quantiser's own output with `nodes_to_exclude`, never a patched graph,
run on the sets INT8 missed on only; static INT8 takes its calibration from onnxruntime's cache
after the first run (where onnxruntime has one). Above `fanout` units they are ranked in
contiguous groups and only the best group is ranked unit by unit, so a ranking costs about
fanout · log_fanout(units) quantiser runs rather than one per node. Caps: `max_rounds` reverts
checked, `max_trials` quantiser runs in all.

Why not localise the first diverging tensor (as FP16 does): its error is relative to the tensor's
own scale, so on a flat input every feature that reads ~0 in float "diverges" (an edge filter on a
grey frame: a rounding of 1e-3 against 1e-8), and the nodes whose rounding reaches the outputs may
come after any number of those. The error share is measured where the tolerance is judged: at
the outputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from modelport.errors import BadInputError
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import Tolerance, check

MIN_GAIN = 0.01  # a unit that removes less than this part of the current error is not kept in float
FANOUT = 16
_WORST = 2.0  # the error of one output that is NaN/Inf or has the wrong shape (as an opposite one's)


@dataclass
class Held:
    """What the fallback found: the best model (parity holds unless `reason` says why not)."""

    model: object  # onnx.ModelProto
    parity: object  # ParityResult on every set
    kept: list[dict] = field(default_factory=list)  # {"node", "op", "error"(, "with")}, in the order kept
    tried: list[dict] = field(default_factory=list)  # units checked and not kept: {"nodes", "error", "why"}
    missed_on: list[str] = field(default_factory=list)
    quantised: int = 0  # nodes the quantiser changed
    rounds: int = 0  # nodes or groups kept in float and checked on every set
    trials: int = 0  # quantiser runs
    error_left: float = 1.0  # E of the result / E of the first INT8 model
    reason: str | None = None


def quantised_nodes(base, first) -> list[tuple[str, str]]:
    """(name, op type) of the nodes of `base` that the quantiser changed in `first`, in graph order:
    no longer there with the same name, type and inputs (dynamic INT8 replaces a node by integer
    ops, QDQ makes it read its inputs through DequantizeLinear)."""
    same = {(n.name, n.op_type, tuple(n.input)) for n in first.graph.node}
    return [(n.name, n.op_type) for n in base.graph.node if (n.name, n.op_type, tuple(n.input)) not in same]


def exclusion_units(base, first, names: list[str]) -> list[tuple[str, ...]]:
    """Each quantised node alone, then each tensor that `first` quantises with the quantised nodes
    that produce or read it (two or more), in graph order."""
    pos = {n: i for i, n in enumerate(names)}
    quantised = {n.input[0] for n in first.graph.node if n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear")}
    touching: dict[str, list[str]] = {}
    for node in base.graph.node:
        if node.name in pos:
            for t in (*node.input, *node.output):
                if t in quantised and node.name not in touching.setdefault(t, []):
                    touching[t].append(node.name)
    units = [(n,) for n in names]
    seen = set(units)
    for group in touching.values():
        unit = tuple(sorted(group, key=pos.__getitem__))
        if len(unit) > 1 and unit not in seen:
            seen.add(unit)
            units.append(unit)
    return sorted(units, key=lambda u: (pos[u[0]], len(u)))


def output_errors(sets, outputs: list[dict]) -> dict[tuple[str, str], float]:
    """e per (set kind, output): 1 − cosine of a float output (0 where both are 0, 1 where one is),
    the share of elements that differ for another; _WORST where the output is missing, misshapen or
    NaN/Inf where the reference is finite."""
    errors = {}
    for s, got in zip(sets, outputs, strict=True):
        for name, ref in s.outputs.items():
            r = np.asarray(ref)
            c = np.asarray(got[name]) if name in got else None
            if c is None or c.shape != r.shape:
                errors[s.kind, name] = _WORST
            elif not np.issubdtype(r.dtype, np.floating):
                errors[s.kind, name] = float(np.mean(c != r)) if r.size else 0.0
            else:
                ok = np.isfinite(r)
                r, c = r[ok].astype(np.float64), c[ok].astype(np.float64)
                if not np.isfinite(c).all():
                    errors[s.kind, name] = _WORST
                    continue
                norms = float(np.linalg.norm(r)) * float(np.linalg.norm(c))
                if norms == 0.0:
                    errors[s.kind, name] = 0.0 if not (r.any() or c.any()) else 1.0
                else:
                    errors[s.kind, name] = max(0.0, 1.0 - float(np.dot(r, c)) / norms)
    return errors


def missed_pairs(parity, first_kind: str) -> list[tuple[str, str]]:
    """(set kind, output) of every output that failed on a set, from a ParityResult."""
    if parity.samples:
        return [(x["kind"], o["name"]) for x in parity.samples for o in x["outputs"] if not o["ok"]]
    return [(first_kind, o.name) for o in parity.outputs if not o.ok]


@dataclass
class _Unit:
    nodes: tuple[str, ...]
    members: list[tuple[str, ...]] | None = None  # a group of units, ranked unit by unit when it comes first
    error: float = math.inf  # E with it kept in float (and the nodes kept before it was measured)


def _groups(units: list[tuple[str, ...]], fanout: int) -> list[_Unit]:
    """`units` as at most `fanout` entries: the units themselves, or contiguous groups of them."""
    if len(units) <= fanout:
        return [_Unit(u) for u in units]
    size = math.ceil(len(units) / fanout)
    out = []
    for i in range(0, len(units), size):
        chunk = units[i:i + size]
        nodes = tuple(dict.fromkeys(n for u in chunk for n in u))
        out.append(_Unit(chunk[0]) if len(chunk) == 1 else _Unit(nodes, members=chunk))
    return out


class _Search:
    """The state of one fallback: the quantiser, the sets, the counters, the best trial so far."""

    def __init__(self, quantise: Callable[[list[str]], object], names: list[str], ref, tol: Tolerance, hop: str,
                 pairs: list[tuple[str, str]], *, max_trials: int):
        self.quantise, self.names, self.ref, self.tol, self.hop = quantise, names, ref, tol, hop
        self.pairs = pairs  # (set kind, output) where INT8 missed: where the error is measured
        kinds = {k for k, _ in pairs}
        self.missed = [s for s in ref.sets() if s.kind in kinds]
        self.max_trials = max_trials
        self.trials = 0
        self.first: dict[tuple[str, str], float] | None = None  # e of the first INT8 model, per pair
        self.spare: tuple[frozenset, object] | None = None  # the best trial of the last ranking, for its check

    def error(self, model, runner=None) -> float:
        """E of `model`. The first model measured is the first INT8 model: its errors are the scale (E = 1)."""

        runner = runner or OnnxRuntimeRunner(model)
        e = output_errors(self.missed, runner.run_many([s.inputs for s in self.missed]))
        if self.first is None:
            self.first = {p: e.get(p, _WORST) for p in self.pairs}
        judged = [p for p in self.pairs if self.first[p] > 0]
        return sum(e.get(p, _WORST) / self.first[p] for p in judged) / len(judged) if judged else 0.0

    def trial(self, excluded: list[str]) -> tuple[object | None, float]:
        """(the model with `excluded` in float, its E); (None, inf) where the quantiser refuses it."""
        self.trials += 1
        try:
            model = self.quantise(excluded)
        except BadInputError:
            return None, math.inf
        return model, self.error(model)

    def rank(self, entries: list[_Unit], kept: list[str], current: float, fanout: int) -> list[_Unit]:
        """The entries that lower the error by MIN_GAIN of `current` or more, best first."""
        scored = []
        best = None
        for u in entries:
            new = [n for n in u.nodes if n not in kept]
            if not new:
                continue
            if len(kept) + len(new) >= len(self.names):  # measured alone it would leave no node in INT8
                if u.members:
                    scored += self.rank(_groups(u.members, fanout), kept, current, fanout)
                continue
            if self.trials >= self.max_trials:
                break
            model, u.error = self.trial(kept + new)
            if u.error <= current * (1 - MIN_GAIN):
                scored.append(u)
                if not u.members and (best is None or u.error < best[1]):
                    best = (frozenset(kept + new), u.error)
                    self.spare = (best[0], model)
            del model
        return sorted(scored, key=lambda u: u.error)

    def verify(self, excluded: list[str]):
        """(model, parity on every set, E) with `excluded` in float; None where the quantiser refuses it."""

        key = frozenset(excluded)
        if self.spare is not None and self.spare[0] == key:
            model = self.spare[1]
        else:
            self.trials += 1
            try:
                model = self.quantise(excluded)
            except BadInputError:
                return None
        self.spare = None
        runner = OnnxRuntimeRunner(model)
        return model, check(runner, self.ref, self.tol, self.hop), self.error(model, runner)


def hold_parity(quantise: Callable[[list[str]], object], base, first, parity, ref, tol: Tolerance, hop: str, *,
                max_rounds: int = 8, max_trials: int = 64, fanout: int = FANOUT) -> Held:
    """Keep the quantised nodes that break parity in float, worst first (see the module docstring).

    `quantise(excluded)` runs the quantiser with those node names kept in float; `first` is its
    output with none, which failed `parity` (on `ref`'s sets, judged with `tol`). Returns the model
    whose error is lowest, with what was kept and tried; `reason` says why parity still fails."""
    candidates = quantised_nodes(base, first)
    names = [n for n, _ in candidates]
    ops = dict(candidates)
    search = _Search(quantise, names, ref, tol, hop, missed_pairs(parity, ref.sets()[0].kind), max_trials=max_trials)
    held = Held(first, parity, missed_on=[s.kind for s in search.missed], quantised=len(names))
    if not names:
        held.reason = "the quantiser changed no node"
        return held
    current = search.error(first)
    kept: list[str] = []
    units = exclusion_units(base, first, names)
    pending = search.rank(_groups(units, fanout), kept, current, fanout)
    fresh = True  # `pending` was ranked with the nodes kept now
    no_gain: set[tuple[str, ...]] = set()  # units checked without gain since the last node was kept
    while not held.parity.ok:
        if held.rounds >= max_rounds:
            held.reason = f"stopped at its round limit ({max_rounds} nodes or groups checked)"
            break
        if search.trials >= max_trials:
            held.reason = f"stopped at its limit of {max_trials} quantiser runs"
            break
        if not pending:
            if fresh:
                held.reason = _nothing_helps(names, kept, held.tried)
                break
            left = [u for u in units if not set(u) <= set(kept) and u not in no_gain]
            pending, fresh = search.rank(_groups(left, fanout), kept, current, fanout), True
            continue
        u = pending.pop(0)
        if u.members:
            pending[:0] = search.rank(_groups(u.members, fanout), kept, current, fanout)
            continue
        new = [n for n in u.nodes if n not in kept]
        if not new:
            continue
        if len(kept) + len(new) >= len(names):
            held.tried.append({"nodes": new, "error": None, "why": "would leave no node in INT8"})
            continue
        checked = search.verify(kept + new)
        held.rounds += 1
        if checked is None:
            held.tried.append({"nodes": new, "error": None, "why": "the quantiser failed with it in float"})
            continue
        model, parity, error = checked
        share = round(current - error, 4)
        if not parity.ok and error > current * (1 - MIN_GAIN):
            # ranked before the nodes kept since: rank what is left again (NNCF re-ranks then too)
            held.tried.append({"nodes": new, "error": share, "why": "no gain"})
            no_gain.add(u.nodes)
            pending = []
            continue
        for n in new:
            entry = {"node": n, "op": ops[n], "error": share}
            if len(new) > 1:
                entry["with"] = [m for m in new if m != n]
            held.kept.append(entry)
        kept += new
        held.model, held.parity, current, fresh = model, parity, error, False
        no_gain.clear()
    held.trials = search.trials
    held.error_left = round(current, 4)
    if held.reason:
        sets = ", ".join(f"'{k}'" for k in held.missed_on)
        held.reason = f"INT8 missed on the {sets} sample{'s' if len(held.missed_on) > 1 else ''} and {held.reason}"
        if held.kept or held.tried:
            held.reason += f"; nodes tried in float: {tried_nodes(held)}"
    return held


def tried_nodes(held: Held) -> str:
    """The nodes the fallback checked, in words: each with its share of the error, or why it was not kept."""
    words = []
    for k in held.kept:
        words.append(f"{k['node']} ({k['op']}, {k['error']:.0%} of the error" + (f", with {', '.join(k['with'])})" if k.get("with") else ")"))
    kept = {k["node"] for k in held.kept}
    for t in (t for t in held.tried if not set(t["nodes"]) <= kept):  # one tried before it was kept: named once
        share = f"{t['error']:.0%} of the error, " if t["error"] is not None else ""
        words.append(f"{'+'.join(t['nodes'])} ({share}{t['why']})")
    return "; ".join(words)


def _nothing_helps(names: list[str], kept: list[str], tried: list[dict]) -> str:
    left = [n for n in names if n not in kept]
    if len(names) == 1:
        return f"its one quantised node, '{names[0]}', cannot be kept in float (no node would stay in INT8)"
    if len(left) == 1:
        return f"every quantised node but '{left[0]}' is in float and it still misses: keeping that one too would leave no node in INT8"
    if any(t["why"] == "would leave no node in INT8" for t in tried):
        return f"keeping more of the {len(left)} nodes still in INT8 in float would leave none of them quantised"
    return (f"keeping any other of the {len(left)} nodes still in INT8 in float lowers the error by less than "
            f"{MIN_GAIN:.0%}")
