"""train/activation_offload.py: saved activations copied out in forward and back in backward, values unchanged.

Tests (CPU: `offload_types=("cpu",)` makes the CPU an offload device, so the copies, the prefetch walk and
the bookkeeping run as on CUDA, without streams): a tiny GPT's loss and every grad equal those without
offload bit for bit, with a prefetch window of one tensor and of all of them; parameters and views of them
are never copied (only a Linear's input is); a second backward over a retained graph reads the same values;
with the default offload types a CPU run copies nothing. Leaves out: CUDA side streams, pinned memory and
overlap (bench/ on the device).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerolaunch.models.gpt import build
from zerolaunch.train.activation_offload import OffloadActivations


def _loss_and_grads(model, ids, hooks=None):
    model.zero_grad(set_to_none=True)
    if hooks is None:
        loss = model(input_ids=ids, labels=ids).loss
    else:
        with hooks:
            loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("prefetch_bytes", [1, 1 << 30])
def test_gpt_loss_and_grads_equal_without_offload(prefetch_bytes):
    torch.manual_seed(0)
    model = build(size="tiny", vocab_size=64, seq_len=16)
    ids = torch.randint(0, 64, (2, 16))
    plain_loss, plain = _loss_and_grads(model, ids)
    hooks = OffloadActivations(
        model.parameters(), min_bytes=0, prefetch_bytes=prefetch_bytes, offload_types=("cpu",)
    )
    loss, grads = _loss_and_grads(model, ids, hooks)
    assert hooks.offloaded_bytes > 0
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    for name, g in plain.items():
        torch.testing.assert_close(grads[name], g, rtol=0, atol=0, msg=name)


def test_params_and_their_views_stay_put():
    lin = nn.Linear(5, 4)
    x = torch.randn(3, 5)
    hooks = OffloadActivations(lin.parameters(), min_bytes=0, offload_types=("cpu",))
    with hooks:
        y = lin(x).sum()  # saves x and weight.t() (a view of the param)
    y.backward()
    assert hooks.offloaded_bytes == x.numel() * x.element_size()
    torch.testing.assert_close(lin.weight.grad, x.sum(0).expand(4, 5), rtol=0, atol=0)


def test_a_retained_graph_reads_the_same_values_twice():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(8, 8)
    hooks = OffloadActivations([w], min_bytes=0, offload_types=("cpu",))
    with hooks:
        y = torch.tanh(x @ w).pow(2).sum()
    y.backward(retain_graph=True)
    first = w.grad.clone()
    y.backward()
    torch.testing.assert_close(w.grad, 2 * first, rtol=0, atol=0)


def test_a_cpu_run_copies_nothing_by_default():
    model = build(size="tiny", vocab_size=64, seq_len=16)
    ids = torch.randint(0, 64, (2, 16))
    hooks = OffloadActivations(model.parameters())
    _loss_and_grads(model, ids, hooks)
    assert hooks.offloaded_bytes == 0
