"""ZeroLaunchEngine.consolidated_state_dict(): the unsharded model's state dict, on rank 0, at every stage.

Tests (2 gloo ranks, one spawn for every case): at stages 0-3 (stage 3 with each block its own unit and no
persistent params, so every param is gathered) rank 0's dict has exactly the keys of the unsharded model's
state_dict (both names of a tied weight, the persistent buffer, not the non-persistent one) and its values,
bit for bit, on CPU; the other rank gets {}. Each rank builds the model from its own seed, so only rank 0's
weights (what the engine starts from) can match the reference, built here in the test process. With bf16
compute at stages 2 and 3 the dict is fp32 and, after a step, holds the fp32 master weights, not bf16 values. Also that
`engine.module.state_dict()` under stage 3 holds placeholders, not the weights (what docs/deepspeed.md says).
"""

from __future__ import annotations

import pytest
import torch
from _spawn import run_ranks
from torch import nn

CASES = [(0, "fp32"), (1, "fp32"), (2, "fp32"), (3, "fp32"), (2, "bf16"), (3, "bf16")]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 12)
        self.norm = nn.LayerNorm(12)

    def forward(self, h):
        return h + self.fc(self.norm(h))


class Net(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(50, 12)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.frozen = nn.Linear(12, 12)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(12, 50, bias=False)
        self.head.weight = self.embed.weight  # tied: both names are in state_dict
        self.register_buffer("shift", torch.randn(12))
        self.register_buffer("table", torch.randn(7), persistent=False)

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(self.frozen(h) + self.shift)


def _run(rank, world_size):
    import zerolaunch
    from zerolaunch.zero import EngineOptions, PrecisionOptions, ZeroOptions

    out = {}
    for stage, dtype in CASES:
        zero = ZeroOptions(stage=stage, stage3_param_persistence_threshold=0, stage3_units=("Block",))
        options = EngineOptions(zero=zero, precision=PrecisionOptions(dtype=dtype))
        engine = zerolaunch.initialize(Net(seed=rank), options, device="cpu")
        out[(stage, dtype)] = {
            "consolidated": engine.consolidated_state_dict(),
            "module_fc": engine.module.state_dict()["blocks.0.fc.weight"].clone(),
        }
        if dtype == "bf16":
            ids = torch.arange(8).reshape(2, 4) + rank
            engine.backward(engine(ids).float().square().mean())
            engine.step()
            out[(stage, dtype)]["stepped"] = engine.consolidated_state_dict()
        engine.close()
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_run, 2)


@pytest.mark.parametrize("stage, dtype", CASES)
def test_rank0_gets_the_unsharded_state_dict(ranks, stage, dtype):
    model = Net(seed=0)
    want = model.state_dict()
    got = ranks[0][(stage, dtype)]["consolidated"]
    assert list(got) == list(want)  # same keys, same order: tied names and the persistent buffer only
    for name, tensor in want.items():
        assert got[name].device.type == "cpu" and got[name].dtype == torch.float32, name
        if dtype == "bf16":
            # every stage's fp32 master starts from the model cast to bf16, as DeepSpeed's (the frozen params
            # and the buffer, which have no master, are bf16 themselves)
            tensor = tensor.bfloat16().float()
        assert torch.equal(got[name], tensor), name
    assert ranks[1][(stage, dtype)]["consolidated"] == {}


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_gives_the_fp32_master(ranks, stage):
    # after a step the master holds values bf16 cannot: a dict of the bf16 params upcast would hold none
    stepped = ranks[0][(stage, "bf16")]["stepped"]
    for name in ("embed.weight", "blocks.2.fc.weight"):
        assert stepped[name].dtype == torch.float32
        assert not torch.equal(stepped[name], stepped[name].bfloat16().float()), name
    assert ranks[1][(stage, "bf16")]["stepped"] == {}


def test_module_state_dict_under_stage3_is_not_the_weights(ranks):
    want = Net(seed=0).state_dict()["blocks.0.fc.weight"]
    placeholder = ranks[0][(3, "fp32")]["module_fc"]
    assert placeholder.shape == want.shape and not torch.equal(placeholder, want)
    assert torch.equal(ranks[0][(2, "fp32")]["module_fc"], want)
