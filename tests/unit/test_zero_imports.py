"""zero/ imports only torch, the standard library and itself (checked with ast, sub-folders included); only
comm.CommContext makes CUDA streams, each by its job; and the shared helpers.

Also the small pure pieces other engine modules build on: param collection with tied weights, the decay
grouping, the optimizer builder's parity with plain torch.optim, and option validation messages.
"""

import ast
import pathlib
import sys

import pytest
import torch
from torch import nn

import zerolaunch.zero as zero_pkg
from zerolaunch.zero.optim.torch_optim import build_optimizer
from zerolaunch.zero.options import EngineOptions, OffloadOptions, OptimizerOptions, ZeroOptions
from zerolaunch.zero.param_groups import collect_aliases, collect_params, split_decay_groups

ZERO_DIR = pathlib.Path(zero_pkg.__file__).parent
ALLOWED_TOP = {"torch", "__future__"} | set(sys.stdlib_module_names)


def _zero_files() -> list[pathlib.Path]:
    return sorted(ZERO_DIR.rglob("*.py"))


def test_zero_imports_nothing_of_ours_outside_zero():
    bad = []
    for path in _zero_files():
        rel = path.relative_to(ZERO_DIR)
        # a module in zero/ reaches zero/ itself with level 1; one in zero/<folder>/ with level 2, and so on.
        top_level = len(rel.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level > top_level:
                    bad.append(f"{rel}: relative import above zero/ (level {node.level})")
                    continue
                names = [] if node.level >= 1 else [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if name.startswith("zerolaunch.zero") or top in ALLOWED_TOP:
                    continue
                bad.append(f"{rel}: import {name}")
    assert not bad, bad


def test_zero_import_check_walks_the_sub_folders():
    folders = {
        p.relative_to(ZERO_DIR).parts[0] for p in _zero_files() if len(p.relative_to(ZERO_DIR).parts) > 1
    }
    assert {"flat", "stage3", "optim"} <= folders, folders


def test_only_the_comm_context_makes_cuda_streams():
    """The engine's side streams are comm.CommContext's (one owner, each stream's job documented there)."""
    makers = [str(p.relative_to(ZERO_DIR)) for p in _zero_files() if "cuda.Stream(" in p.read_text()]
    assert makers == ["comm.py"], makers


@pytest.mark.parametrize("overlap", [True, False])
def test_comm_context_streams_by_job(monkeypatch, overlap):
    """Off CUDA every stream is None; on CUDA (a stand-in class here) reduce and gather exist with overlap
    only, the copy stream whenever asked for; each is made once, at its first use, and they are distinct."""
    from zerolaunch.zero.comm import CommContext

    cpu = CommContext(torch.device("cpu"), None, overlap=overlap)
    assert (cpu.reduce_stream, cpu.gather_stream, cpu.copy_stream) == (None, None, None)
    made = []

    class FakeStream:
        def __init__(self, device):
            made.append(device)

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    ctx = CommContext(torch.device("cuda", 0), None, overlap=overlap)
    assert not made  # nothing until a user asks
    streams = [ctx.reduce_stream, ctx.gather_stream, ctx.copy_stream]
    assert [ctx.reduce_stream, ctx.gather_stream, ctx.copy_stream] == streams  # the same objects again
    assert [s is not None for s in streams] == [overlap, overlap, True]
    assert len(made) == len({id(s) for s in streams if s is not None}) == (3 if overlap else 1)


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.frozen = nn.Linear(4, 2)
        self.frozen.requires_grad_(False)


def test_collect_params_counts_tied_once_and_records_aliases():
    m = _Tied()
    names = [n for n, _ in collect_params(m)]
    assert names == ["a.weight", "a.bias", "b.bias", "frozen.weight", "frozen.bias"]
    assert collect_aliases(m) == {"a.weight": ("b.weight",)}
    decay, no_decay = split_decay_groups(collect_params(m), 0.1)
    assert decay["names"] == ["a.weight"] and decay["weight_decay"] == 0.1
    assert no_decay["names"] == ["a.bias", "b.bias"] and no_decay["weight_decay"] == 0.0


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_build_optimizer_matches_torch_optim(name):
    opts = OptimizerOptions(name=name, lr=0.01, weight_decay=0.1, momentum=0.9)
    torch.manual_seed(0)
    ours = [torch.randn(37), torch.randn(11)]
    ref = [t.clone() for t in ours]
    groups = [{"params": [ours[0]], "weight_decay": 0.1}, {"params": [ours[1]], "weight_decay": 0.0}]
    opt = build_optimizer(opts, groups, torch.device("cpu"))
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[name]
    kw = {"momentum": 0.9} if name == "sgd" else {}
    ref_opt = cls(
        [{"params": [ref[0]], "weight_decay": 0.1}, {"params": [ref[1]], "weight_decay": 0.0}], lr=0.01, **kw
    )
    for step in range(5):
        g = torch.Generator().manual_seed(step)
        for a, b in zip(ours, ref, strict=True):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        ref_opt.step()
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "options,match",
    [
        (EngineOptions(zero=ZeroOptions(stage=4)), "zero.stage"),
        (EngineOptions(zero=ZeroOptions(reduce_bucket_size=0)), "reduce_bucket_size"),
        (EngineOptions(gradient_accumulation_steps=0), "gradient_accumulation_steps"),
        (EngineOptions(gradient_clipping=-1.0), "gradient_clipping"),
        (
            EngineOptions(zero=ZeroOptions(stage=0, offload_optimizer=OffloadOptions(device="cpu"))),
            "needs ZeRO stage 1, 2 or 3",
        ),
        (EngineOptions(zero=ZeroOptions(stage=2, offload_optimizer=OffloadOptions(device="nvme"))), "nvme"),
        (EngineOptions(optimizer=OptimizerOptions(name="lamb")), "optimizer.name"),
    ],
)
def test_engine_rejects_bad_options_with_the_key(options, match):
    with pytest.raises(ValueError, match=match):
        zero_pkg.Engine(nn.Linear(3, 3), options)
