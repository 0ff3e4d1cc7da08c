"""estimate-memory's price of the chunked linear + cross-entropy (memory/linear_loss.py, model.args.loss_chunk).

Covers: the formula against the most bytes of tensors alive at once during the real linear_cross_entropy's
forward and backward on the CPU (bf16 and fp32, chunks smaller and larger than the rounding of the weight's
gradient); detect_arch reading loss_chunk off the built-in GPT and an HF model (and None without it); the
activation estimate at a long sequence dropping the logits' bytes. Leaves out: CUDA allocator rounding.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from zerolaunch.memory.linear_loss import linear_loss_peak_bytes
from zerolaunch.models.linear_ce import linear_cross_entropy


class LiveBytes(TorchDispatchMode):
    """The peak of the summed storage bytes of tensors aten made and that are still referenced."""

    def __init__(self, outside):
        super().__init__()
        self.outside, self.live, self.now, self.peak = outside, {}, 0, 0

    def _free(self, key):
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                key = t.untyped_storage().data_ptr()
                if key and key not in self.live and key not in self.outside:
                    self.live[key] = t.untyped_storage().nbytes()
                    self.now += self.live[key]
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(t, self._free, key)
        return out


@pytest.mark.parametrize(
    ("rows", "dtype"),
    [(16, torch.bfloat16), (128, torch.bfloat16), (16, torch.float32), (128, torch.float32)],
)
def test_peak_matches_live_tensor_bytes_on_cpu(rows, dtype):
    n, v, d = 512, 1000, 64
    hidden = torch.randn(n, d, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, d, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, v, (n,))
    outside = {x.untyped_storage().data_ptr() for x in (hidden, weight, labels)}
    with LiveBytes(outside) as live:
        linear_cross_entropy(hidden, weight, labels, chunk_rows=rows).backward()
    want = linear_loss_peak_bytes(n, v, d, hidden.element_size(), rows)
    assert live.peak == pytest.approx(want, rel=0.05)


def test_detect_arch_reads_loss_chunk():
    from zerolaunch.memory.modules import detect_arch
    from zerolaunch.models import gpt
    from zerolaunch.models.hf import build

    with torch.device("meta"):
        assert detect_arch(gpt.build("tiny", vocab_size=97, loss_chunk=64)).linear_loss_rows == 64
        assert detect_arch(gpt.build("tiny", vocab_size=97)).linear_loss_rows is None
    config = dict(
        model_type="llama", vocab_size=53, hidden_size=16, intermediate_size=24, num_hidden_layers=2
    )
    config.update(num_attention_heads=2, num_key_value_heads=1)
    assert detect_arch(build(config=config, loss_chunk=32, meta=True)).linear_loss_rows == 32
    assert detect_arch(build(config=config, meta=True)).linear_loss_rows is None


def test_long_sequence_estimate_drops_the_logits():
    from types import SimpleNamespace

    from zerolaunch.memory.activations import activation_bytes
    from zerolaunch.memory.arch import Arch

    setup = SimpleNamespace(micro_batch=1, seq_len=32768, dtype_bytes=2)
    base = dict(n_layer=32, d_model=4096, n_head=32, vocab_size=128256, d_ff=14336, gated_mlp=True)
    hf = activation_bytes(Arch(**base), setup, checkpointing=True)
    chunked = activation_bytes(Arch(**base, linear_loss_rows=4096), setup, checkpointing=True)
    fp32_logits = 4 * 32768 * 128256
    assert hf - chunked > 2 * fp32_logits  # HF's loss holds 3 fp32 (tokens, vocab) tensors at its peak
