"""The zerolaunch Trainer door honours TrainingArguments(gradient_checkpointing=True) at ZeRO stages 0-3.

Runs tests/hf/_hf_checkpointing.py (2 CPU gloo ranks, fp32, tests/hf/_hf_run.py's tiny Llama, 5 steps with
accumulation 2, clipping): with checkpointing every decoder layer is flagged for recomputation, and every logged
loss and grad norm and every saved weight equal the same run without it. Not covered: memory (estimate-memory
and bench/longseq.py).
"""

from __future__ import annotations

import _hf_checkpointing
import pytest
import torch

pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _hf_checkpointing.run(tmp_path_factory.mktemp("hf_ckpt"))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_checkpointed_run_equals_plain(runs, stage):
    plain, ckpt = runs[(stage, False)], runs[(stage, True)]
    assert plain["checkpointed_layers"] == 0 and ckpt["checkpointed_layers"] == 2  # both decoder layers
    assert len(plain["loss"]) == 5
    torch.testing.assert_close(torch.tensor(ckpt["loss"]), torch.tensor(plain["loss"]), rtol=1e-6, atol=0)
    torch.testing.assert_close(
        torch.tensor(ckpt["grad_norm"]), torch.tensor(plain["grad_norm"]), rtol=1e-5, atol=0
    )
    for name, expected in plain["weights"].items():
        torch.testing.assert_close(ckpt["weights"][name], expected, rtol=1e-5, atol=1e-6, msg=name)
