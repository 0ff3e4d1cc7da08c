"""estimate-memory arithmetic without an engine: input parsing, the --params stand-in, activations, the
recommendation order, and the torch-free import of the --params path.

Leaves out: equality with a real Engine (test_memory_engine.py), DeepSpeed's formulas
(test_memory_deepspeed.py), the command line (tests/e2e/test_estimate_cli.py).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest
from _estimate_setup import bf16_setup

from zerolaunch.memory import EstimateError, Setup, estimate, parse_bytes, parse_count, synthetic_gpt
from zerolaunch.memory.activations import activation_bytes
from zerolaunch.memory.engine_layout import stage012_layout, stage2_staging_buffers
from zerolaunch.zero.options import (
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)

GIB = 2**30


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("80GiB", 80 * GIB),
        ("80GB", 80 * 10**9),
        ("24gib", 24 * GIB),
        ("5GB", 5 * 10**9),
        ("200MB", 200 * 10**6),
        ("512MiB", 512 * 2**20),
        ("2kB", 2000),
        ("2KiB", 2048),
        ("81920MiB", 80 * GIB),
        ("1024", 1024),
        ("1.5 TiB", int(1.5 * 2**40)),
        (80 * GIB, 80 * GIB),
    ],
)
def test_parse_bytes(text, nbytes):
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize("text", ["80gigs", "-1GiB", "0", "", "GiB", "1e999GiB", "80 Gib s"])
def test_parse_bytes_rejects_with_the_form_to_use(text):
    with pytest.raises(EstimateError, match="80GiB"):
        parse_bytes(text)


@pytest.mark.parametrize(
    "text, decimal, binary", [("24G", "24GB", "24GiB"), ("5m", "5MB", "5MiB"), ("1T", "1TB", "1TiB")]
)
def test_a_bare_prefix_is_refused_naming_both_meanings(text, decimal, binary):
    with pytest.raises(EstimateError, match="ambiguous") as info:
        parse_bytes(text)
    assert decimal in str(info.value) and binary in str(info.value)


def test_convert_and_estimate_share_one_size_convention():
    from zerolaunch.checkpoint.convert import parse_size
    from zerolaunch.checkpoint.errors import CheckpointError

    for text in ("5GB", "5GiB", "200MB", "512MiB", "1.5TB", "10"):
        assert parse_size(text) == parse_bytes(text)
    assert parse_size("5GB") == 5 * 10**9 and parse_size("5GiB") == 5 * 2**30
    with pytest.raises(CheckpointError, match="--max-shard-size: '5G' is ambiguous; write 5GB"):
        parse_size("5G")
    with pytest.raises(CheckpointError, match="e.g. 5GB"):
        parse_size("five")


@pytest.mark.parametrize(
    "text, count",
    [
        ("7e9", 7 * 10**9),
        ("7B", 7 * 10**9),
        ("1.3b", 1_300_000_000),
        ("350M", 350 * 10**6),
        ("125_000_000", 125 * 10**6),
    ],
)
def test_parse_count(text, count):
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["-5", "0", "abc", "7X", "0.4"])
def test_parse_count_rejects(text):
    with pytest.raises(EstimateError, match="--params"):
        parse_count(text)


@pytest.mark.parametrize("total", [1, 5_000, 10**6, 124_475_904, 1_300_000_000, 7 * 10**9, 175 * 10**9])
def test_synthetic_gpt_has_exactly_the_asked_parameter_count(total):
    shape = synthetic_gpt(total)
    assert shape.numel == total
    assert not shape.exact
    # every trainable tensor is in exactly one stage-3 unit
    in_units = [n for u in shape.units for n in u.param_names]
    assert sorted(in_units) == sorted(s.name for s in shape.specs)


def test_synthetic_gpt_looks_like_the_gpt3_table():
    arch = synthetic_gpt(1_300_000_000).arch
    assert (arch.d_model, arch.n_head) == (2048, 16) and 22 <= arch.n_layer <= 24
    assert synthetic_gpt(7 * 10**9).arch.d_model == 4096


def test_setup_holds_the_engines_options_and_declares_none_of_its_own():
    # one default per option: Setup carries EngineOptions as the engine takes them, no copy of a field
    engine_fields = {
        f.name
        for cls in (EngineOptions, ZeroOptions, PrecisionOptions, OptimizerOptions, OffloadOptions)
        for f in fields(cls)
    }
    own = {f.name for f in fields(Setup)} - {"engine"}
    assert not own & engine_fields
    assert Setup().engine == EngineOptions()
    assert Setup().dtype == EngineOptions().precision.dtype
    # options the engine would refuse are refused by its own rule, named by its key
    with pytest.raises(EstimateError, match="zero.stage3_prefetch_bucket_size"):
        Setup(engine=EngineOptions(zero=ZeroOptions(stage3_prefetch_bucket_size=-1)))
    # 0 (no prefetch) is the engine's to accept, and so the estimate's
    assert estimate(synthetic_gpt(10**6), bf16_setup(stage3_prefetch_bucket_size=0)).row(3)


def test_bad_setup_values_are_named():
    with pytest.raises(EstimateError, match="--gpus"):
        bf16_setup(gpus_per_node=0)
    with pytest.raises(EstimateError, match="--micro-batch"):
        bf16_setup(micro_batch=-1)
    with pytest.raises(EstimateError, match="precision.dtype"):
        bf16_setup(dtype="int8")


def test_activations_grow_linearly_with_micro_batch_and_checkpointing_saves():
    arch = synthetic_gpt(350 * 10**6).arch
    one = activation_bytes(arch, bf16_setup(micro_batch=1, seq_len=1024), checkpointing=False)
    four = activation_bytes(arch, bf16_setup(micro_batch=4, seq_len=1024), checkpointing=False)
    assert four == 4 * one
    ckpt = activation_bytes(arch, bf16_setup(micro_batch=4, seq_len=1024), checkpointing=True)
    assert ckpt < four / 2
    assert activation_bytes(None, bf16_setup(), checkpointing=False) is None


def test_activation_block_count_for_one_gpt_layer_by_hand():
    # 1 layer, d=64, 4 heads, vocab 100, B=2, T=8, bf16: block 17*d*16 tokens*2 B + LN stats + lse
    from zerolaunch.memory.shape import Arch

    arch = Arch(n_layer=1, d_model=64, n_head=4, vocab_size=100, d_ff=256)
    tokens = 16
    block = 2 * tokens * 17 * 64 + 16 * tokens + 4 * 2 * 4 * 8
    head = 2 * tokens * 2 * 64 + 8 * tokens
    loss = 12 * tokens * 100
    assert (
        activation_bytes(arch, bf16_setup(micro_batch=2, seq_len=8), checkpointing=False)
        == block + head + loss
    )


def test_chunked_loss_peak_for_one_gpt_layer_by_hand():
    # the layer of the test above with the built-in GPT's chunked loss: 16 tokens in chunks of 5 rows
    # (5, 5, 5, 1), bf16 logits 2 B * 16 * 100 = 3200 B, one fp32 chunk 4 * 5 * 100 = 2000 B.
    # forward: the logits + one chunk's fp32 copy and its log_softmax = 3200 + 4000
    # backward: the logits + their grad (bf16) + a chunk's fp32 copy and softmax = 3200 + 3200 + 4000 = 10400
    from zerolaunch.memory.shape import Arch

    arch = Arch(n_layer=1, d_model=64, n_head=4, vocab_size=100, d_ff=256, loss_chunk_rows=5)
    tokens = 16
    block = 2 * tokens * 17 * 64 + 16 * tokens + 4 * 2 * 4 * 8
    head = 2 * tokens * 2 * 64 + 8 * tokens
    assert (
        activation_bytes(arch, bf16_setup(micro_batch=2, seq_len=8), checkpointing=False)
        == block + head + 10400
    )
    # one chunk holds every row: the logits + their grad + an fp32 copy of all of them and its softmax
    one = Arch(n_layer=1, d_model=64, n_head=4, vocab_size=100, d_ff=256, loss_chunk_rows=64)
    assert activation_bytes(
        one, bf16_setup(micro_batch=2, seq_len=8), checkpointing=False
    ) == block + head + (2 * 3200 + 2 * 4 * tokens * 100)


def test_chunked_loss_is_cheaper_than_unchunked_at_gpt_350m_shapes():
    # micro batch 8 x seq 2048 = 16384 tokens, vocab 50304, bf16; the GPT's chunk: 2**26 // 50304 = 1334 rows
    from zerolaunch.memory.activations import loss_peak_bytes

    tokens, vocab = 16384, 50304
    logits = 2 * tokens * vocab  # 1.54 GiB
    chunk = 4 * 1334 * vocab  # 0.25 GiB
    assert loss_peak_bytes(tokens, vocab, 2, 1334) == 2 * logits + 2 * chunk < 3 * logits
    assert loss_peak_bytes(tokens, vocab, 2, None) == 12 * tokens * vocab == 6 * logits


def test_detect_arch_gives_the_built_in_gpts_loss_chunk_and_none_elsewhere():
    import torch

    from zerolaunch.memory.modules import detect_arch
    from zerolaunch.models.gpt import CE_CHUNK_ELEMENTS, build

    with torch.device("meta"):
        gpt = build(size="tiny", vocab_size=1000, seq_len=16)
    assert detect_arch(gpt).loss_chunk_rows == CE_CHUNK_ELEMENTS // 1000

    class Other(torch.nn.Module):
        class config:  # noqa: N801 - Hugging Face's attribute name
            num_hidden_layers, hidden_size, num_attention_heads, vocab_size = 2, 64, 4, 1000

    assert detect_arch(Other()).loss_chunk_rows is None


@pytest.mark.parametrize(
    "rows, dtype", [(64, "bfloat16"), (512, "bfloat16"), (1024, "bfloat16"), (512, "float32")]
)
def test_chunked_loss_peak_matches_live_tensor_bytes_on_cpu(monkeypatch, rows, dtype):
    """The formula against the real chunked_cross_entropy: the most bytes of tensors alive at once during its
    forward and backward on (1024, 1000) logits, counted by storage as aten allocates and frees them."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    import zerolaunch.models.gpt as gpt
    from zerolaunch.memory.activations import loss_peak_bytes

    n, v = 1024, 1000
    monkeypatch.setattr(gpt, "CE_CHUNK_ELEMENTS", rows * v)
    logits = torch.randn(n, v, dtype=getattr(torch, dtype), requires_grad=True)
    labels = torch.randint(0, v, (n,))
    outside = {logits.untyped_storage().data_ptr(), labels.untyped_storage().data_ptr()}

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live, self.now, self.peak = {}, 0, 0

        def _free(self, key):
            self.now -= self.live.pop(key, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    key = t.untyped_storage().data_ptr()
                    # a view shares its base's storage: counted once, when the base was made
                    if key and key not in self.live and key not in outside:
                        self.live[key] = t.untyped_storage().nbytes()
                        self.now += self.live[key]
                        self.peak = max(self.peak, self.now)
                        weakref.finalize(t, self._free, key)
            return out

    with LiveBytes() as live:
        gpt.chunked_cross_entropy(logits, labels).backward()
    # the logits are the caller's (the lm_head output, alive anyway); the formula counts them
    measured = live.peak + logits.numel() * logits.element_size()
    assert measured == pytest.approx(loss_peak_bytes(n, v, logits.element_size(), rows), rel=0.01)


def test_stage2_staging_buffers_follow_the_reducer_policy():
    shape = synthetic_gpt(124_000_000)
    names = [s.name for s in shape.specs]
    lay = stage012_layout(shape.specs, 2, 4, 5_000_000)
    # the no-decay bucket (biases, norms) fills during the whole backward: it holds one buffer while the
    # decay buckets take turns with the other (with overlap, at the 2-buffer cap, taking a buffer first
    # completes the oldest reduce-scatter and reuses its buffer).
    assert len(lay.buckets) > 10
    assert stage2_staging_buffers(lay, names, overlap=False) == 2
    assert stage2_staging_buffers(lay, names, overlap=True) == 2
    decay_only = [n for n in names if n.endswith("weight") and ".ln_" not in n and "ln_f" not in n]
    # without the interleaved no-decay group one buffer is enough when nothing overlaps
    assert stage2_staging_buffers(lay, decay_only, overlap=False) == 1


def _est(gpu_memory, **kw):
    setup = bf16_setup(gpus_per_node=8, gpu_memory_bytes=gpu_memory, **kw)
    return estimate(synthetic_gpt(1_300_000_000), setup)


def test_recommendation_among_equal_communication_takes_the_one_with_margin():
    everything = _est(10**15)
    # stages 0-2 communicate the same (2x the params per step): the lowest peak of them wins, here stage 2
    plain = {s: everything.row(s).gpu_total_bytes for s in (0, 1, 2)}
    assert min(plain, key=plain.get) == 2 and everything.recommended == (2, "none", False)
    s2 = plain[2]
    # fits only within (1 - headroom): at exactly s2 / 0.9 it fits, one byte less it does not
    assert _est(int(s2 / 0.9) + 1).recommended == (2, "none", False)
    tight = _est(int(s2 / 0.9) - 2)
    assert tight.recommended != (2, "none", False) and not tight.row(2).fits and tight.row(2).misfit == "GPU"
    assert _est(s2, headroom=0.0).recommended == (2, "none", False)
    assert _est(s2).recommended != (2, "none", False)  # 100% use is not a fit under the default 10%


def test_seven_b_on_one_80gb_gpu_takes_stage_2_offload_not_stage_1_at_the_limit():
    shape = synthetic_gpt(7 * 10**9)
    for headroom in (0.0, 0.1):
        setup = bf16_setup(gpu_memory_bytes=80 * GIB, cpu_memory_bytes=512 * GIB, headroom=headroom)
        est = estimate(shape, setup)
        s1, s2 = est.row(1, "optimizer-cpu"), est.row(2, "optimizer-cpu")
        assert s2.gpu_total_bytes < s1.gpu_total_bytes / 3  # the issue: 18.9 vs 75.3 GiB
        assert est.recommended == (2, "optimizer-cpu", False), (headroom, est.recommendation)


def test_host_ram_is_named_when_it_is_what_does_not_fit():
    shape = synthetic_gpt(7 * 10**9)
    est = estimate(shape, bf16_setup(gpu_memory_bytes=80 * GIB, cpu_memory_bytes=24 * GIB))
    assert est.recommended is None
    on_gpu = [r for r in est.rows if r.supported and r.gpu_total_bytes <= 0.9 * 80 * GIB]
    assert on_gpu and all(r.misfit == "host RAM" for r in on_gpu)
    least = min(r.cpu_node_bytes for r in on_gpu)
    assert f"host RAM: needs {least / GIB:.1f} GiB per node" in est.recommendation
    assert "has 24.0 GiB" in est.recommendation and "GPU:" not in est.recommendation
    # the same model with the RAM it needs: recommended
    roomy = estimate(shape, bf16_setup(gpu_memory_bytes=80 * GIB, cpu_memory_bytes=int(least / 0.9) + 1))
    assert roomy.recommended is not None


def test_recommendation_falls_back_to_checkpointing_then_offload():
    base = _est(10**15, micro_batch=16, seq_len=2048)
    smallest_plain = min(r.gpu_total_bytes for r in base.rows if r.supported and r.offload == "none")
    got = _est(smallest_plain - 1, micro_batch=16, seq_len=2048, headroom=0.0).recommended
    assert got is not None and got[1] == "none" and got[2] is True  # checkpointing before any offload


def test_nothing_fits_says_what_to_change():
    est = _est(1)
    assert est.recommended is None and "Nothing fits" in est.recommendation and "--gpus" in est.recommendation
    assert "GPU: needs" in est.recommendation and "host RAM" not in est.recommendation


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2, True])
def test_headroom_must_be_a_fraction(bad):
    with pytest.raises(EstimateError, match="--headroom"):
        bf16_setup(headroom=bad)


@pytest.mark.parametrize("ckpt", [False, True])
def test_largest_micro_batch_fits_and_one_more_does_not(ckpt):
    gpu = 40 * GIB
    shape = synthetic_gpt(1_300_000_000)
    est = estimate(shape, bf16_setup(gpus_per_node=8, gpu_memory_bytes=gpu, seq_len=2048))
    checked = 0
    for row in est.rows:
        if not row.supported:
            continue
        mb = row.max_micro_batch_ckpt if ckpt else row.max_micro_batch
        assert mb is not None

        def peak(micro_batch, row=row):
            setup = bf16_setup(gpus_per_node=8, gpu_memory_bytes=gpu, seq_len=2048, micro_batch=micro_batch)
            r = estimate(shape, setup).row(row.stage, row.offload)
            return r.gpu_total_ckpt_bytes if ckpt else r.gpu_total_bytes

        if mb:
            assert peak(mb) <= 0.9 * gpu
            checked += 1
        assert peak(mb + 1) > 0.9 * gpu
    assert checked >= 5
    if not ckpt:
        assert est.row(3, "optimizer+params-cpu").max_micro_batch > est.row(0).max_micro_batch


def test_largest_micro_batch_is_unknown_without_gpu_memory_or_model_sizes():
    assert all(r.max_micro_batch is None for r in _est(None).rows)
    flat = estimate(
        synthetic_gpt(1000), bf16_setup(gpu_memory_bytes=GIB)
    )  # one flat tensor: no decoder sizes
    assert all(r.max_micro_batch is None for r in flat.rows)


def test_no_gpu_memory_means_no_fit_column():
    est = _est(None)
    assert est.recommended is None and all(r.fits is None for r in est.rows if r.supported)
    assert "--gpu-memory" in est.recommendation


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_nvme_rows_are_priced(stage):
    est = _est(10**15)
    nvme, cpu = est.row(stage, "optimizer-nvme"), est.row(stage, "optimizer-cpu")
    assert nvme.supported and nvme.fits
    # the swap file holds what cpu offload keeps in host memory; the GPU side is the same
    assert nvme.nvme_bytes == cpu.host["master"] + cpu.host["optimizer"] > 0
    assert nvme.gpu == cpu.gpu and nvme.host["master"] == 0 and cpu.nvme_bytes == 0
    # the host keeps the grad shard and buffer_count staging chunks of (master + 2 moments), far less
    assert nvme.host["grads"] == cpu.host["grads"]
    assert 0 < nvme.host["optimizer"] < cpu.host["master"] + cpu.host["optimizer"]
    assert nvme.host["optimizer"] % (4 * 3 * est.setup.engine.zero.offload_optimizer.buffer_count) == 0
    assert [r.offload for r in est.rows if r.stage == 0] == ["none"]


def test_param_nvme_row_keeps_the_unit_shards_on_disk():
    est = _est(10**15)
    nvme, cpu, opt_nvme = (
        est.row(3, o) for o in ("optimizer+params-nvme", "optimizer+params-cpu", "optimizer-nvme")
    )
    assert nvme.supported and nvme.gpu == cpu.gpu  # the GPU holds the same with params on the host or disk
    # the host keeps only the persistent params' shard; the units' 16-bit shards join the optimizer swap file
    swapped = cpu.host["params"] - nvme.host["params"]
    assert swapped > 0 and nvme.nvme_bytes == opt_nvme.nvme_bytes + swapped
    assert (
        nvme.host["grads"] == opt_nvme.host["grads"] and nvme.host["optimizer"] == opt_nvme.host["optimizer"]
    )
    assert [r.offload for r in est.rows if r.stage < 3 and r.offload.startswith("optimizer+params")] == []


def test_params_path_imports_no_torch():
    code = (
        "import sys\n"
        "from zerolaunch.memory import Setup, estimate, synthetic_gpt\n"
        "estimate(synthetic_gpt(7 * 10**9), Setup(gpus_per_node=8))\n"
        "import zerolaunch.cli.estimate\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_gated_mlp_keeps_two_more_d_ff_wide_tensors_per_layer():
    from zerolaunch.memory.shape import Arch

    setup = bf16_setup(micro_batch=2, seq_len=8, dtype="bf16")
    plain = Arch(n_layer=3, d_model=64, n_head=4, vocab_size=100, d_ff=176)
    gated = Arch(n_layer=3, d_model=64, n_head=4, vocab_size=100, d_ff=176, gated_mlp=True)
    extra = activation_bytes(gated, setup, checkpointing=False) - activation_bytes(
        plain, setup, checkpointing=False
    )
    assert extra == 3 * 2 * 176 * 16 * 2  # layers x tensors x d_ff x tokens x bf16 bytes


def test_memory_package_has_no_import_cycle():
    """Every import between zerolaunch/memory modules (also the lazy ones inside functions) forms no cycle."""
    import ast
    from pathlib import Path

    import zerolaunch.memory as pkg

    folder = Path(pkg.__file__).parent
    edges = {}
    for path in folder.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("zerolaunch.memory.")
            ):
                names.add(node.module.rsplit(".", 1)[1])
            elif (
                isinstance(node, ast.ImportFrom)
                and node.module == "zerolaunch.memory"
                and path.stem != "__init__"
            ):
                names.update(a.name for a in node.names if (folder / f"{a.name}.py").exists())
        edges[path.stem] = names

    def reaches(start, goal, seen=()):
        return any(
            n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in edges.get(start, ())
        )

    cyclic = sorted(m for m in edges if m != "__init__" and reaches(m, m))
    assert not cyclic, f"import cycle through {cyclic}"
    assert "shape" not in edges["modules"]


def test_reuse_distance_keeps_the_units_that_end_the_forward():
    from zerolaunch.memory.stage3 import gathered_peak_numel, reuse_kept

    blocks, root = [10, 10, 10, 10], 5
    assert reuse_kept(blocks, root, 0, 10**9) == [False] * 4
    # the last unit's next use is its own backward, right after: nothing gathered in between
    assert reuse_kept(blocks, root, 1, 10**9) == [False, False, False, True]
    # unit 2 sees unit 3 twice (its forward, then its backward) before its own backward: 20 < 21
    assert reuse_kept(blocks, root, 21, 10**9) == [False, False, True, True]
    assert reuse_kept(blocks, root, 20, 10**9) == [False, False, False, True]
    # within max_live: root + kept so far + the unit + the largest unit gathered before its reuse
    assert reuse_kept(blocks, root, 10**9, 25) == [True, False, False, True]
    # no prefetch: the root, the unit running and the one just finished, or every kept unit at the end
    assert gathered_peak_numel([root, *blocks], 0, 10**9) == 25
    assert gathered_peak_numel([root, *blocks], 0, 10**9, 10**9) == 45
    assert gathered_peak_numel([root, *blocks], 0, 10**9, 1) == 25  # the kept last unit is the "previous"


def test_estimate_counts_the_units_kept_by_max_reuse_distance():
    freed, kept = (_est(10**15, stage3_max_reuse_distance=d).row(3) for d in (0, 10**9))
    assert kept.buffer_peak_bytes > freed.buffer_peak_bytes
    assert kept.gpu_total_bytes - freed.gpu_total_bytes == kept.buffer_peak_bytes - freed.buffer_peak_bytes
    assert _est(10**15, stage3_max_reuse_distance=10**9).row(2) == _est(10**15).row(2)  # stage 3 only
    with pytest.raises(EstimateError, match="stage3_max_reuse_distance"):
        bf16_setup(stage3_max_reuse_distance=-1)


def test_offload_with_accumulation_holds_the_window_sums_on_the_gpu():
    """[Note: device-summed window] in zero/reduce.py: with the grad shard on the host and several micro-steps a
    window, stages 2 and 3 sum the reduced grads on the GPU in fp32 (one more grad shard, the host one's size)
    from the window's first backward to the step; one micro-step a window, or stage 1, keeps none."""
    from dataclasses import replace

    shape = synthetic_gpt(50_000_000)
    base = bf16_setup(gpus_per_node=2)
    accumulating = replace(base, engine=replace(base.engine, gradient_accumulation_steps=4))
    one, four = ({(r.stage, r.offload): r for r in estimate(shape, s).rows} for s in (base, accumulating))
    for key, row in one.items():
        if not row.supported:
            continue
        stage, offload = key
        extra = four[key].gpu["grads"] - row.gpu["grads"]
        if stage >= 2 and offload != "none":
            assert row.host["grads"] > 0 and extra == row.host["grads"], key
            assert four[key].gpu_total_bytes - row.gpu_total_bytes == extra, key
        else:
            assert extra == 0, key
