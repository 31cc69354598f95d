"""`convert --task text-generation` holds its weights a bounded number of times.

Two random-init Qwen2 folders that differ only in their vocabulary are converted side by side in two
child processes (int4 with --optimize all: export, reference, fusion, quantiser and every onnxruntime
session run), while a sampler reads the RSS of each child's whole process tree. The difference between the two
peaks is the memory the extra weights cost (libraries, arenas and code paths are the same in both),
and must stay within two and a half copies of those weights (fp32): Qwen2 is written from its safetensors a
tensor at a time, the transformers reference holds the model in its own process, fusion, the
quantiser and emission read and write the weights a tensor at a time, and one onnxruntime session
runs at a time. A pass, quantiser or session that keeps another copy of the model pushes it past the
bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.hf_folders import build

# weights: a 256k x 128 tied embedding (131 MB in fp32) and one small layer
BIG = dict(vocab_size=256_000, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
           num_key_value_heads=2)
SMALL = {**BIG, "vocab_size": 128}
COPIES = 2.5  # peak(BIG) - peak(SMALL) <= COPIES x the extra fp32 weight bytes (measured 1.1-1.9 with the decoder
# writer: the fp32 session holds the embedding and its transpose for the output projection; 2.6 with the dynamo
# export, 8.6 before that)


class TreePeak:
    """A command in a child process, the RSS of its whole process tree sampled every 0.05 s."""

    def __init__(self, cmd: list[str], env: dict):
        import psutil

        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        self.root, self.peak = psutil.Process(self.proc.pid), 0
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()

    def _sample(self):
        import psutil

        while self.proc.poll() is None:
            try:
                total = sum(p.memory_info().rss for p in [self.root, *self.root.children(recursive=True)])
            except psutil.Error:
                total = 0
            self.peak = max(self.peak, total)
            time.sleep(0.05)

    def wait(self) -> tuple[int, int, str]:
        """(exit code, peak RSS bytes of the tree, output)."""
        out = self.proc.communicate()[0].decode(errors="replace")
        self.sampler.join()
        return self.proc.returncode, self.peak, out


def _convert(folder: Path, out: Path) -> TreePeak:
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), "HF_HUB_OFFLINE": "1"}
    return TreePeak([sys.executable, "-m", "modelport", "convert", str(folder), "--task", "text-generation",
                     "--precision", "int4", "--optimize", "all", "--accuracy-budget", "tokens>=0", "--new-tokens", "2",
                     "-o", str(out)], env)


def _weight_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))  # saved in fp32


@pytest.mark.timeout(300)
def test_peak_memory_grows_by_a_few_copies_of_the_weights(tmp_path):
    small = build("qwen2", tmp_path / "small", **SMALL)
    big = build("qwen2", tmp_path / "big", **BIG)
    extra = _weight_bytes(big) - _weight_bytes(small)
    runs = [_convert(small, tmp_path / "out-small"), _convert(big, tmp_path / "out-big")]  # side by side: each tree apart
    check_copies(*runs, extra=extra, bound=COPIES)


def check_copies(small: TreePeak, big: TreePeak, *, extra: int, bound: float) -> float:
    """Both runs succeed and the larger one's peak exceeds the smaller one's by at most `bound`
    times the `extra` weight bytes; returns that ratio."""
    (rc_small, peak_small, log_small), (rc_big, peak_big, log_big) = small.wait(), big.wait()
    assert rc_small == 0, log_small[-2000:]
    assert rc_big == 0, log_big[-2000:]
    copies = (peak_big - peak_small) / extra
    print(f"peak {peak_small / 1e6:.0f} MB -> {peak_big / 1e6:.0f} MB for {extra / 1e6:.0f} MB more fp32 weights: "
          f"{copies:.2f} copies")
    assert copies <= bound, (f"converting {extra / 1e6:.0f} MB more weights took {(peak_big - peak_small) / 1e6:.0f} MB "
                             f"more memory at peak: {copies:.1f} copies of them (at most {bound})")
    return copies
