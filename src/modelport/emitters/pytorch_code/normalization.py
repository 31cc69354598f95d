"""BatchNorm, LayerNorm, GroupNorm, InstanceNorm, RMSNorm, LpNormalization, LRN.

Constant parameters make `nn.*Norm` submodules (trainable, with running statistics for BatchNorm);
otherwise the functional form or the explicit formula is written.
"""

from __future__ import annotations

import numpy as np

from modelport.emitters.pytorch_code.registry import CONVERTERS


@CONVERTERS.register("BatchNormalization")
def batch_norm(n):
    if n.attr("training_mode", 0) or any(n.used(j) for j in range(1, len(n.outputs))):
        _batch_norm_training(n)
        return
    eps = n.attr("epsilon", 1e-5)
    consts = [n.const(i) for i in range(1, 5)]
    rank = n.rank(0)
    eps_arg = "" if abs(eps - 1e-5) < 1e-12 else f", eps={n.gen.literal(eps)}"
    if all(c is not None and c.dtype.kind == "f" and c.ndim == 1 for c in consts) and rank in (2, 3, 4, 5):
        scale, bias, mean, var = consts
        nd = {2: 1, 3: 1, 4: 2, 5: 3}[rank]
        momentum = 1.0 - n.attr("momentum", 0.9)
        mom_arg = "" if abs(momentum - 0.1) < 1e-6 else f", momentum={n.gen.literal(round(momentum, 6))}"
        state = {"weight": scale, "bias": bias, "running_mean": mean, "running_var": var,
                 "num_batches_tracked": np.array(0, dtype=np.int64)}
        mod = n.submodule(n.module_hint(1), f"nn.BatchNorm{nd}d({scale.shape[0]}{eps_arg}{mom_arg})", state)
        n.emit(f"{mod}({n.t(0)})")
        return
    n.use("F")
    n.emit(f"F.batch_norm({n.t(0)}, {n.t(3)}, {n.t(4)}, {n.t(1)}, {n.t(2)}, training=False{eps_arg})")


def _batch_norm_training(n):
    """Training mode: normalise with the batch's statistics (biased variance) and also return the
    updated running statistics, running * momentum + batch * (1 - momentum)."""
    if n.opset < 14:
        n.fail("BatchNormalization training outputs before opset 14")
    rank = n.rank(0)
    if rank is None:
        n.fail("BatchNormalization in training mode on an input of unknown rank")
    x = n.t(0)
    dims = "(" + ", ".join(str(d) for d in range(rank) if d != 1) + ("," if rank == 2 else "") + ")"
    view = "1, -1" + ", 1" * (rank - 2)
    eps, momentum = n.gen.literal(n.attr("epsilon", 1e-5)), n.attr("momentum", 0.9)
    mean, var = n.tmp("batch_mean"), n.tmp("batch_var")
    n.line(f"{mean} = {x}.mean(dim={dims})")
    n.line(f"{var} = {x}.var(dim={dims}, unbiased=False)")
    scale, bias = n.t(1), n.t(2)
    n.emit(f"({x} - {mean}.reshape({view})) * torch.rsqrt({var}.reshape({view}) + {eps}) * {scale}.reshape({view})"
           f" + {bias}.reshape({view})")
    keep, new = n.gen.literal(momentum), n.gen.literal(round(1.0 - momentum, 9))
    if n.used(1):
        n.emit(f"{n.t(3)} * {keep} + {mean} * {new}", 1)
    if n.used(2):
        n.emit(f"{n.t(4)} * {keep} + {var} * {new}", 2)


def _norm_dims(x: str, axis: int, rank: int | None) -> str:
    """The dims normalised over, `axis` to the last: a literal tuple when the rank is known or the
    axis counts from the back, else computed from `x.dim()` at run time."""
    if rank is None and axis >= 0:
        return f"tuple(range({axis}, {x}.dim()))"
    dims = range(axis, rank) if rank is not None else range(axis, 0)
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


@CONVERTERS.register("LayerNormalization")
def layer_norm(n):
    axis = n.attr("axis", -1)
    eps = n.attr("epsilon", 1e-5)
    rank = n.rank(0)
    shape = n.shape(0)
    x = n.t(0)
    scale, bias = n.const(1), n.const(2) if n.has(2) else None
    if axis < 0 and rank is not None:
        axis += rank
    norm_shape = shape[axis:] if shape is not None and axis >= 0 else None
    static = norm_shape is not None and all(isinstance(d, int) and d > 0 for d in norm_shape)
    stats_used = n.used(1) or n.used(2)
    eps_arg = "" if abs(eps - 1e-5) < 1e-12 else f", eps={n.gen.literal(eps)}"
    if (static and not stats_used and scale is not None and list(scale.shape) == list(norm_shape)
            and (not n.has(2) or (bias is not None and list(bias.shape) == list(norm_shape)))
            and scale.dtype == np.float32):
        dims = ", ".join(str(d) for d in norm_shape)
        shape_arg = str(norm_shape[0]) if len(norm_shape) == 1 else f"({dims})"
        state = {"weight": scale}
        if n.has(2):
            state["bias"] = bias
        extra = "" if n.has(2) else ", bias=False"
        mod = n.submodule(n.module_hint(1), f"nn.LayerNorm({shape_arg}{eps_arg}{extra})", state)
        n.emit(f"{mod}({x})")
        return
    dims = _norm_dims(x, axis, rank)
    mean = n.tmp("mean")
    inv_std = n.tmp("inv_std")
    xf = f"{x}.float()" if n.dtype(0) in ("float16", "bfloat16") else x
    n.line(f"{mean} = {xf}.mean(dim={dims}, keepdim=True)")
    n.line(f"{inv_std} = torch.rsqrt(({xf} - {mean}).pow(2).mean(dim={dims}, keepdim=True) + {n.gen.literal(eps)})")
    expr = f"(({xf} - {mean}) * {inv_std})"
    if n.dtype(0) in ("float16", "bfloat16"):
        expr = f"{expr}.to({x}.dtype)"
    expr = f"{expr} * {n.t(1)}"
    if n.has(2):
        expr = f"{expr} + {n.t(2)}"
    n.emit(expr)
    if n.used(1):
        n.emit(mean, 1)
    if n.used(2):
        n.emit(inv_std, 2)


@CONVERTERS.register("RMSNormalization")
def rms_norm(n):
    axis = n.attr("axis", -1)
    eps = n.attr("epsilon", 1e-5)
    rank = n.rank(0)
    if axis < 0 and rank is not None:
        axis += rank
    x = n.t(0)
    dims = _norm_dims(x, axis, rank)
    xf = f"{x}.float()" if n.dtype(0) in ("float16", "bfloat16") else x
    expr = f"({xf} * torch.rsqrt({xf}.pow(2).mean(dim={dims}, keepdim=True) + {n.gen.literal(eps)}))"
    if n.dtype(0) in ("float16", "bfloat16"):
        expr = f"{expr}.to({x}.dtype)"
    n.emit(f"{expr} * {n.t(1)}")


@CONVERTERS.register("InstanceNormalization")
def instance_norm(n):
    eps = n.attr("epsilon", 1e-5)
    n.use("F")
    eps_arg = "" if abs(eps - 1e-5) < 1e-12 else f", eps={n.gen.literal(eps)}"
    n.emit(f"F.instance_norm({n.t(0)}, weight={n.t(1)}, bias={n.t(2)}{eps_arg})")


@CONVERTERS.register("GroupNormalization")
def group_norm(n):
    groups = n.attr("num_groups")
    eps = n.attr("epsilon", 1e-5)
    scale, bias = n.const(1), n.const(2)
    shape = n.shape(0)
    channels = shape[1] if shape and isinstance(shape[1], int) else None
    n.use("F")
    eps_arg = "" if abs(eps - 1e-5) < 1e-12 else f", eps={n.gen.literal(eps)}"
    if n.opset < 21:
        # Opset 18 scales per group; torch scales per channel.
        if channels is None:
            n.fail("GroupNormalization (opset 18) on an unknown channel count")
        reps = channels // groups
        w = f"{n.t(1)}.repeat_interleave({reps})"
        b = f"{n.t(2)}.repeat_interleave({reps})"
        n.emit(f"F.group_norm({n.t(0)}, {groups}, {w}, {b}{eps_arg})")
        return
    if scale is not None and bias is not None and channels is not None and scale.shape == (channels,):
        mod = n.submodule(n.module_hint(1), f"nn.GroupNorm({groups}, {channels}{eps_arg})", {"weight": scale, "bias": bias})
        n.emit(f"{mod}({n.t(0)})")
        return
    n.emit(f"F.group_norm({n.t(0)}, {groups}, {n.t(1)}, {n.t(2)}{eps_arg})")


@CONVERTERS.register("LpNormalization")
def lp_norm(n):
    p = n.attr("p", 2)
    axis = n.attr("axis", -1)
    x = n.t(0)
    n.emit(f"{x} / torch.linalg.vector_norm({x}, ord={p}, dim={axis}, keepdim=True)")


@CONVERTERS.register("LRN")
def lrn(n):
    n.use("F")
    size = n.attr("size")
    alpha, beta, bias = n.attr("alpha", 1e-4), n.attr("beta", 0.75), n.attr("bias", 1.0)
    lit = n.gen.literal
    n.emit(f"F.local_response_norm({n.t(0)}, {size}, alpha={lit(alpha)}, beta={lit(beta)}, k={lit(bias)})")


@CONVERTERS.register("MeanVarianceNormalization")
def mvn(n):
    axes = n.attr("axes", [0, 2, 3])
    x = n.t(0)
    dims = "(" + ", ".join(str(a) for a in axes) + ("," if len(axes) == 1 else "") + ")"
    mean = n.tmp("mean")
    n.line(f"{mean} = {x}.mean(dim={dims}, keepdim=True)")
    n.emit(f"({x} - {mean}) / torch.sqrt(({x} - {mean}).pow(2).mean(dim={dims}, keepdim=True) + 1e-9)")
