"""PyTorch zoo architectures. Each builder returns a freshly seeded nn.Module in eval mode."""

from __future__ import annotations

import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class CNNSmall(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = _Block(width, width, 1)
        self.layer2 = _Block(width, width * 2, 2)
        self.layer3 = _Block(width * 2, width * 4, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width * 4, num_classes)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class LSTMSmall(nn.Module):
    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 5):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1])


class MLP(nn.Module):
    def __init__(self, features: int = 32, hidden: int = 64, out: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, out)
        self.act = nn.GELU()

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


def _init(module: nn.Module, seed: int) -> nn.Module:
    """Deterministic weights, with non-trivial BatchNorm statistics so folding is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return module.eval()


def cnn_small(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return _init(CNNSmall(), seed)


def lstm_small(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return LSTMSmall().eval()


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MLP().eval()


def bert_tiny(seed: int = 0) -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=128,
    )
    model = BertModel(config, add_pooling_layer=True).eval()
    model.config.return_dict = True
    return model


def save(model: nn.Module, entry, folder):
    """`model.pt2` (ExportedProgram with the entry's dynamic dims) and `model.safetensors`."""
    from pathlib import Path

    from safetensors.torch import save_file

    from modelport.reference.samples import make_inputs

    folder = Path(folder)
    specs = entry.input_specs()
    sample = make_inputs(specs, entry.sample_dims)
    args = tuple(torch.from_numpy(sample[s.name]) for s in specs)
    dims: dict[str, object] = {}
    shapes = tuple({i: dims.setdefault(d, torch.export.Dim(d)) for i, d in s.dynamic_dims.items()} or None for s in specs)
    try:
        ep = torch.export.export(model, args, dynamic_shapes=shapes if any(shapes) else None)
    except Exception:
        # Some dims cannot stay symbolic (e.g. an LSTM's time axis): let torch.export keep what it can.
        auto = tuple({i: torch.export.Dim.AUTO for i in s.dynamic_dims} or None for s in specs)
        ep = torch.export.export(model, args, dynamic_shapes=auto if any(auto) else None)
    torch.export.save(ep, str(folder / "model.pt2"))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    inputs = " ".join(f"--input {t}" for t in entry.inputs)
    hint = f"{{dir}}/model.pt2 {inputs} --to onnx -o OUT  (or {{dir}}/model.safetensors --arch zoo:{entry.name})"
    return [folder / "model.pt2", folder / "model.safetensors"], hint
