"""zerolaunch.hf's arguments: "auto" filled as transformers fills it for DeepSpeed, contradictions refused with
both values named, the classes zero_args makes, and a one-process training run that never imports DeepSpeed.

The "auto" reference is transformers' own HfTrainerDeepSpeedConfig (it needs DeepSpeed installed); the
multi-rank training is in the side-by-side tests of this folder.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces

from zerolaunch.config import load_recipe  # noqa: E402
from zerolaunch.config.errors import UserError  # noqa: E402
from zerolaunch.hf import TrainingArguments, zero_args  # noqa: E402
from zerolaunch.hf.config import ConfigMismatch, TrainerDSConfig, model_hidden  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUCKETS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")

ALL_AUTO = {
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def _args(**kw):
    base = dict(output_dir="/tmp/unused", report_to=[], use_cpu=True)
    base.update(kw)
    return TrainingArguments(**base)


def test_auto_filled_as_transformers_fills_it():
    pytest.importorskip("deepspeed")
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    args = _args(
        per_device_train_batch_size=3,
        gradient_accumulation_steps=5,
        learning_rate=7e-4,
        adam_beta1=0.8,
        adam_beta2=0.95,
        adam_epsilon=1e-7,
        weight_decay=0.03,
        max_grad_norm=0.7,
        warmup_steps=4,
    )
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=40))
    theirs = HfTrainerDeepSpeedConfig(copy.deepcopy(ALL_AUTO))
    theirs.trainer_config_process(args)
    theirs.trainer_config_finalize(args, model, 123)
    unset_hf_deepspeed_config()
    ours = TrainerDSConfig(copy.deepcopy(ALL_AUTO))
    ours.process(args)
    ours.finalize(args, 123)
    # the bucket "auto"s stay for the recipe loader, which resolves them from the model's hidden size
    theirs_zero, ours_zero = theirs.config.pop("zero_optimization"), ours.config.pop("zero_optimization")
    assert ours.config == theirs.config
    assert {k: v for k, v in ours_zero.items() if k not in BUCKETS} == {
        k: v for k, v in theirs_zero.items() if k not in BUCKETS
    }
    assert all(ours_zero[k] == "auto" for k in BUCKETS)
    ours.config["zero_optimization"] = ours_zero
    zero = load_recipe(ours.config, model_hidden=model_hidden(model)).engine.zero
    assert {k: getattr(zero, k) for k in BUCKETS} == {k: theirs_zero[k] for k in BUCKETS}
    assert zero.stage3_prefetch_bucket_size == int(0.9 * 40 * 40)  # theirs is not left "auto"


def test_bucket_autos_are_resolved_by_the_recipe_loader_from_the_models_hidden_size():
    config = {"zero_optimization": {"stage": 3, **dict.fromkeys(BUCKETS, "auto")}}
    model = SimpleNamespace(config=SimpleNamespace(text_config=SimpleNamespace(hidden_size=24)))
    recipe = load_recipe(copy.deepcopy(config), model_hidden=model_hidden(model))
    zero = recipe.engine.zero
    assert (zero.reduce_bucket_size, zero.stage3_prefetch_bucket_size) == (24 * 24, int(0.9 * 24 * 24))
    assert zero.stage3_param_persistence_threshold == 10 * 24
    # config/engine_options.py's own note, naming where h came from: not the recipe's (absent) model section
    note = recipe.notes["engine.zero.reduce_bucket_size"]
    assert recipe.origins["engine.zero.reduce_bucket_size"] == "auto" and "text_config.hidden_size" in note
    # a model without a hidden size: the auto key is named with the fix
    with pytest.raises(UserError, match=r"reduce_bucket_size.*no hidden_size or hidden_sizes"):
        load_recipe(
            copy.deepcopy(config), model_hidden=model_hidden(SimpleNamespace(config=SimpleNamespace()))
        )


def test_arguments_fill_the_config_and_leave_deepspeed_off():
    args = _args(deepspeed=copy.deepcopy(ALL_AUTO), learning_rate=3e-4, per_device_train_batch_size=2)
    assert args.deepspeed is None and args.deepspeed_plugin is None
    assert args.zero_config == ALL_AUTO  # the user's config, unchanged
    assert args.zero_ds_config["optimizer"]["params"]["lr"] == 3e-4
    assert args.zero_ds_config["train_batch_size"] == 2 * args.world_size


def test_contradiction_names_both_values():
    ds = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "gradient_accumulation_steps": 4}
    with pytest.raises(ConfigMismatch) as err:
        _args(deepspeed=ds, learning_rate=2e-5, gradient_accumulation_steps=2)
    text = str(err.value)
    assert "ds optimizer.params.lr=0.001 vs hf learning_rate=2e-05" in text
    assert "ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=2" in text


def test_contradiction_known_at_finalize_names_both_values():
    args = _args(max_steps=5, warmup_steps=2)
    config = TrainerDSConfig({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100}}})
    with pytest.raises(
        ConfigMismatch, match=r"ds scheduler.params.total_num_steps=100 vs hf num_training_steps"
    ):
        config.finalize(args, 5)


def test_unsupported_optimizer_is_refused_with_the_fix():
    from zerolaunch.hf.config import optimizer_block

    with pytest.raises(UserError, match="adamw_torch"):
        optimizer_block(_args(optim="adafactor"))


def test_zero_args_on_trl_config():
    trl = pytest.importorskip("trl")
    cls = zero_args(trl.SFTConfig)
    assert issubclass(cls, trl.SFTConfig) and zero_args(cls) is cls and zero_args(trl.SFTConfig) is cls
    args = cls(
        output_dir="/tmp/unused", report_to=[], use_cpu=True, deepspeed={"zero_optimization": {"stage": 2}}
    )
    back = pickle.loads(pickle.dumps(args))  # training_args.bin
    assert type(back) is cls and back.zero_ds_config == args.zero_ds_config


def test_trains_in_one_process_without_deepspeed(tmp_path):
    # DeepSpeed hidden: an import of it fails, find_spec finds nothing (transformers' availability check)
    script = textwrap.dedent(
        """
        import sys
        sys.modules["deepspeed"] = None
        import torch
        sys.path.insert(0, "tests/hf")
        from _hf_run import TokenData, tiny_llama
        from zerolaunch.hf import Trainer, TrainingArguments
        args = TrainingArguments(output_dir=sys.argv[1], max_steps=2, per_device_train_batch_size=2,
                                 report_to=[], use_cpu=True, save_strategy="no",
                                 deepspeed={"zero_optimization": {"stage": 3}})
        trainer = Trainer(model=tiny_llama(), args=args, train_dataset=TokenData(8))
        trainer.train()
        assert trainer.state.global_step == 2 and trainer.zero_engine.global_steps == 2
        print("OK")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_stage3_pretrained_folder_built_on_meta_loads_unit_by_unit(tmp_path):
    """The stage-3 way in for a pretrained model: zerolaunch.models.hf.build(path=..., meta=True) holds no
    weights; the engine fills each unit from the folder's files. predict() must give the plain model's logits."""
    script = textwrap.dedent(
        """
        import sys, torch
        sys.path.insert(0, "tests/hf")
        from _hf_run import TokenData, tiny_llama
        from zerolaunch.hf import Trainer, TrainingArguments
        from zerolaunch.models.hf import build
        out = sys.argv[1]
        plain = tiny_llama()
        plain.save_pretrained(out + "/pre")
        args = TrainingArguments(output_dir=out, report_to=[], use_cpu=True, per_device_eval_batch_size=4,
                                 deepspeed={"zero_optimization": {"stage": 3}})
        model = build(path=out + "/pre", meta=True)
        assert all(p.is_meta for p in model.parameters())
        pred = Trainer(model=model, args=args).predict(TokenData(4, seed=3))
        with torch.no_grad():
            ref = plain(input_ids=TokenData(4, seed=3).ids).logits
        assert torch.equal(torch.as_tensor(pred.predictions), ref)
        print("OK")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_fp16_skips_are_logged_and_hold_the_schedule_and_offload_runs(tmp_path):
    """fp16 at a loss scale that overflows at first: the engine skips those steps, the Trainer logs their count
    (skipped_steps) and its lr schedule does not advance on them; bf16 at stage 3 with the optimizer on the CPU
    trains. One process; the exactness of the step itself is the side-by-side tests'."""
    script = textwrap.dedent(
        """
        import sys, torch
        sys.path.insert(0, "tests/hf")
        from _hf_run import TokenData, tiny_llama
        from zerolaunch.hf import Trainer, TrainingArguments
        out = sys.argv[1]
        ds = {"zero_optimization": {"stage": 2}, "fp16": {"enabled": "auto", "initial_scale_power": 19, "hysteresis": 1}}
        args = TrainingArguments(output_dir=out + "/fp16", max_steps=8, per_device_train_batch_size=2, report_to=[],
                                 use_cpu=True, save_strategy="no", logging_steps=1, fp16=True, deepspeed=ds)
        t = Trainer(model=tiny_llama(), args=args, train_dataset=TokenData(16))
        t.train()
        skipped = [h["skipped_steps"] for h in t.state.log_history if "loss" in h]
        assert 0 < skipped[-1] < 8, skipped
        assert t.zero_engine.global_steps == 8 - skipped[-1]
        assert t.lr_scheduler.last_epoch == t.zero_engine.global_steps
        ds = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": "auto"}}
        args = TrainingArguments(output_dir=out + "/bf16", max_steps=3, per_device_train_batch_size=2, report_to=[],
                                 use_cpu=True, save_strategy="no", bf16=True, deepspeed=ds)
        t = Trainer(model=tiny_llama(), args=args, train_dataset=TokenData(16))
        t.train()
        o = t.zero_engine.options
        assert (o.precision.dtype, o.zero.offload_optimizer.device, t.zero_engine.global_steps) == ("bf16", "cpu", 3)
        print("OK")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_trainer_without_the_hooks_is_refused_with_the_version():
    import transformers

    from zerolaunch.hf import zero_trainer

    class OldTrainer:  # a Trainer from before _prepare_for_training (transformers 4.x, 5.0)
        pass

    with pytest.raises(UserError, match=rf"_prepare_for_training.*transformers {transformers.__version__}"):
        zero_trainer(OldTrainer)
