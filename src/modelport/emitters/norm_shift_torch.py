"""Shifted normalisation for the routes that convert a PyTorch module (ExecuTorch, litert-torch):
the module run under a torch function mode that feeds every layer, group and instance norm its
input less the first element of each normalised group (x - x₀), the rewrite `norm_shift.py`
makes in the ONNX IR, and says why.

The mode catches the norms at whatever level the module calls them: `F.layer_norm` and its kin
(an eager module, modelport's generated code), or the ATen ops a `.pt2`'s graph module calls
directly (`aten.layer_norm`, `aten.native_layer_norm`, ...). Inside its handler the mode is off,
so the norm itself runs once, on the shifted input. `torch.export` of the wrapped module traces
the subtraction into the program, so the converter downstream sees it as any other op.
`native_layer_norm` and `native_group_norm` also return the mean: it gets x₀ added back.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

F = torch.nn.functional
aten = torch.ops.aten


def _first(x, dims: int):
    """x's first element over its last `dims` dims (kept, to broadcast)."""
    s = x
    for d in range(-dims, 0):
        s = s.narrow(d, 0, 1)
    return s


def _grouped(x, groups: int):
    """(x - x₀ per (sample, group), x₀ of shape (N, groups)) for a group norm over x's channels."""
    g = x.reshape(x.shape[0], groups, -1)
    s = g.narrow(2, 0, 1)
    return (g - s).reshape(x.shape), s.reshape(x.shape[0], groups)


def _arg(args, kwargs, i: int, name: str, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _with_input(args, kwargs, x):
    """The call's arguments with its input replaced by `x`."""
    if args:
        return (x, *args[1:]), kwargs
    return args, {**kwargs, "input": x}


class ShiftNorms(TorchFunctionMode):
    """The mode; it appends each norm call it rewrote to `log` (none: the module is not shifted)."""

    LAYER = (F.layer_norm, torch.layer_norm, aten.layer_norm.default)
    GROUP = (F.group_norm, torch.group_norm, aten.group_norm.default)
    INSTANCE = (F.instance_norm, torch.instance_norm, aten.instance_norm.default)

    def __init__(self, log: list[str]):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = _arg(args, kwargs, 0, "input")
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return func(*args, **kwargs)
        if func in self.LAYER:
            dims = len(_arg(args, kwargs, 1, "normalized_shape"))
            return self._call(func, args, kwargs, x - _first(x, dims))
        if func in self.GROUP:
            return self._call(func, args, kwargs, _grouped(x, int(_arg(args, kwargs, 1, "num_groups")))[0])
        if func in self.INSTANCE and _arg(args, kwargs, 5, "use_input_stats", True) and x.dim() > 2:
            return self._call(func, args, kwargs, x - _first(x, x.dim() - 2))
        if func is aten.native_layer_norm.default:
            s = _first(x, len(args[1]))
            out, mean, rstd = func(x - s, *args[1:], **kwargs)
            self.log.append("native_layer_norm")
            return out, mean + s.reshape(mean.shape), rstd
        if func is aten.native_group_norm.default:
            y, s = _grouped(x, int(args[6]))
            out, mean, rstd = func(y, *args[1:], **kwargs)
            self.log.append("native_group_norm")
            return out, mean + s.reshape(mean.shape), rstd
        return func(*args, **kwargs)

    def _call(self, func, args, kwargs, shifted):
        self.log.append(getattr(func, "__name__", str(func)).split(".")[0])  # 'layer_norm.default' -> 'layer_norm'
        args, kwargs = _with_input(args, kwargs, shifted)
        return func(*args, **kwargs)


class _Log:
    def __init__(self):
        self.calls: list[str] = []


class Shifted(torch.nn.Module):
    """`inner` run under `ShiftNorms`: what `torch.export` traces for the shifted program.
    `shifted()`: the norm calls it rewrote, one per call on every run (none: the module has no norm
    to shift). The log is held by a plain object: `torch.export` restores a module's own list
    attributes after tracing."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.log = _Log()

    def forward(self, *args, **kwargs):
        with ShiftNorms(self.log.calls):
            return self.inner(*args, **kwargs)

    def shifted(self) -> list[str]:
        return sorted(set(self.log.calls))

    def train(self, mode: bool = True):
        try:
            self.inner.train(mode)
        except Exception:
            pass  # an ExportedProgram's module is in inference mode already and refuses train()/eval()
        self.training = mode
        return self
