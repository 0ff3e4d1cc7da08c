"""The DeepSpeed vocabulary: the docs' example configs load, unsupported features are named, misspellings are
refused at every level, no-effect keys are noted, and DeepSpeed's defaults apply.

Leaves out "auto" arithmetic (test_config_auto) and file handling (test_config_load).
"""

from pathlib import Path

import pytest

from zerolaunch.config import RecipeError, load_recipe

DS_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "ds_configs"


def test_deepspeed_stage1_example():
    recipe = load_recipe(DS_CONFIGS / "ds_zero1.json", world_size=2)
    assert recipe.engine.zero.stage == 1
    assert recipe.engine.zero.reduce_bucket_size == 500_000_000
    assert recipe.train.precision == "fp16" and recipe.engine.precision.dtype == "fp16"
    # "Adam" is AdamW unless adam_w_mode is false.
    assert recipe.engine.optimizer.name == "adamw" and recipe.engine.optimizer.lr == 0.00015
    assert (recipe.train.micro_batch_size, recipe.train.gradient_accumulation_steps) == (4, 1)
    assert recipe.engine.precision.initial_scale_power == 16 and recipe.engine.precision.hysteresis == 2
    assert recipe.engine.gradient_clipping == 1.0  # DeepSpeed's default
    assert recipe.engine.zero.overlap_comm is False  # on for stage 3 only
    # A bare ds_config: model and data are the flagged defaults.
    assert (
        recipe.model.builder == "zerolaunch.models.gpt:build" and recipe.origins["model.builder"] == "default"
    )
    assert "bare DeepSpeed config" in recipe.notes["model.builder"]


def test_hf_stage2_example():
    recipe = load_recipe(DS_CONFIGS / "hf_zero2.json", overrides=["train.micro_batch_size=2"], world_size=4)
    zero = recipe.engine.zero
    assert zero.stage == 2 and zero.overlap_comm is True
    assert zero.reduce_bucket_size == 200_000_000
    assert "no effect" in recipe.notes["deepspeed.zero_optimization.allgather_bucket_size"]
    assert zero.offload_optimizer.device == "cpu" and zero.offload_optimizer.pin_memory is True
    assert recipe.train.global_batch_size == 8
    assert recipe.engine.scheduler.name == "WarmupLR"
    assert recipe.engine.scheduler.warmup_max_lr == recipe.train.lr
    assert "deepspeed.zero_optimization.reduce_scatter" in recipe.notes
    assert "no effect" in recipe.notes["deepspeed.steps_per_print"]


def test_hf_stage3_example_resolves_every_auto():
    recipe = load_recipe(
        DS_CONFIGS / "hf_zero3.json",
        overrides=["train.precision=bf16", "train.lr=2e-5", "train.warmup_steps=10"],
        world_size=2,
    )
    zero = recipe.engine.zero
    assert zero.stage == 3 and zero.offload_param.device == "cpu" and zero.offload_optimizer.device == "cpu"
    # HF's example asks for the consolidated 16-bit model at save: honoured, shown with its note.
    assert zero.stage3_gather_16bit_weights_on_model_save is True
    assert "model.safetensors" in recipe.notes["engine.zero.stage3_gather_16bit_weights_on_model_save"]
    assert zero.stage3_max_live_parameters == 1_000_000_000
    assert recipe.engine.precision.dtype == "bf16"
    assert recipe.engine.optimizer.lr == 2e-5 and recipe.engine.scheduler.warmup_max_lr == 2e-5
    assert recipe.engine.scheduler.warmup_num_steps == 10
    for key in (
        "engine.zero.reduce_bucket_size",
        "engine.optimizer.lr",
        "engine.optimizer.betas",
        "engine.precision.dtype",
        "engine.gradient_clipping",
        "engine.scheduler.warmup_num_steps",
    ):
        assert recipe.origins[key] == "auto", key
    assert "auto" not in str(recipe.to_json()["engine"]).replace("'", "")


@pytest.mark.parametrize(
    ("ds", "match"),
    [
        (
            {"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}},
            "DeepSpeed's Lamb optimizer is not supported",
        ),
        ({"optimizer": {"type": "OneBitAdam"}}, "DeepSpeed's OneBitAdam optimizer is not supported"),
        ({"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, "ZeRO\\+\\+ quantized weights"),
        ({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}, "ZeRO\\+\\+ hierarchical"),
        (
            {"zero_optimization": {"stage": 2, "zero_quantized_gradients": True}},
            "ZeRO\\+\\+ quantized gradients",
        ),
        ({"zero_optimization": {"stage": 3, "mics_shard_size": 8}}, "MiCS"),
        ({"pipeline": {"stages": 2}}, "pipeline parallelism is not supported"),
        ({"sparse_attention": {"mode": "fixed"}}, "sparse_attention is not supported"),
        ({"scheduler": {"type": "OneCycle"}}, "DeepSpeed's OneCycle scheduler is not supported"),
        ({"optimizer": {"type": "Adam", "params": {"amsgrad": True}}}, "AMSGrad is not supported"),
    ],
)
def test_unsupported_features_are_named(ds, match):
    with pytest.raises(RecipeError, match=match):
        load_recipe({"deepspeed": ds})


def test_features_turned_off_are_accepted_with_a_note():
    recipe = load_recipe(
        {
            "deepspeed": {
                "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 1},
                "flops_profiler": {"enabled": False},
            }
        }
    )
    assert "feature off" in recipe.notes["deepspeed.zero_optimization.zero_hpz_partition_size"]
    assert "deepspeed.flops_profiler" in recipe.notes


@pytest.mark.parametrize(
    ("ds", "wrong", "right"),
    [
        ({"zero_optimisation": {"stage": 2}}, "zero_optimisation", "zero_optimization"),
        (
            {"zero_optimization": {"stage": 2, "overlap_com": True}},
            "zero_optimization.overlap_com",
            "overlap_comm",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"devic": "cpu"}}},
            "offload_param.devic",
            "device",
        ),
        ({"fp16": {"enable": True}}, "fp16.enable", "enabled"),
        (
            {"optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}}},
            "params.weight_decy",
            "weight_decay",
        ),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 3}}},
            "params.warmup_num_step",
            "warmup_num_steps",
        ),
    ],
)
def test_misspelled_keys_at_any_level(ds, wrong, right):
    with pytest.raises(RecipeError) as err:
        load_recipe({"deepspeed": ds})
    assert wrong in str(err.value) and f"Did you mean `{right}`?" in str(err.value)


def test_misspelled_top_level_key_of_a_bare_config_is_refused(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 8, "zero_optimisation": {"stage": 2}}')
    with pytest.raises(RecipeError, match="silently ignore"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("ds", "match"),
    [
        ({"zero_optimization": {"stage": 4}}, "between 0 and 3"),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}},
            "must be one of none, cpu, nvme",
        ),
        ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, "only ZeRO stage 3"),
        (
            {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
            "needs ZeRO stage 1, 2 or 3",
        ),
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "no nvme_path"),
        (
            {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "overlap_step": True}}},
            "for ZeRO stages 1 and 2",
        ),
        ({"zero_optimization": {"stage": 2, "offload_optimizer": {"overlap_step": True}}}, "device is none"),
        ({"zero_optimization": {"stage": 3, "offload_param": {"overlap_step": True}}}, "overlap_step"),
        ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "both enabled"),
        ({"optimizer": {"type": "AdamW", "params": {"lr": -0.1}}}, "must be > 0"),
        ({"zero_optimization": {"stage": "auto"}}, '"auto", which zerolaunch cannot resolve'),
        ({"zero_optimization": {"reduce_bucket_size": "big"}}, "must be an integer"),
        ({"communication_data_type": "fp8"}, "must be one of fp32, fp16, bf16"),
        ({"optimizer": {"type": "Adamm"}}, "Did you mean `Adam`"),
        ({"zero_optimization": 3}, "must be a mapping"),
    ],
)
def test_bad_deepspeed_values(ds, match):
    with pytest.raises(RecipeError, match=match):
        load_recipe({"deepspeed": ds})


def test_offload_keys_reach_the_engine_options():
    z = load_recipe(
        {
            "deepspeed": {
                "zero_optimization": {
                    "stage": 2,
                    "reduce_bucket_size": 5e8,
                    "offload_optimizer": {"device": "cpu", "overlap_step": True},
                }
            }
        }
    ).engine.zero
    assert z.offload_optimizer.overlap_step and z.offload_optimizer.pin_memory
    # reduce_bucket_size is an upper bound; offloading caps the buckets (grads reach the host sooner).
    assert z.reduce_bucket_size == 500_000_000 and z.bucket_numel == 50_000_000
    plain = load_recipe({"deepspeed": {"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}})
    assert plain.engine.zero.bucket_numel == 500_000_000
    assert not plain.engine.zero.offload_optimizer.overlap_step


def test_precision_conflict_between_spellings():
    with pytest.raises(RecipeError, match="disagrees with `deepspeed.bf16.enabled`"):
        load_recipe({"train": {"precision": "fp16"}, "deepspeed": {"bf16": {"enabled": True}}})
    assert load_recipe({"deepspeed": {"bf16": {"enabled": True}}}).train.precision == "bf16"


def test_adam_modes_and_sgd():
    adam = load_recipe(
        {"deepspeed": {"optimizer": {"type": "Adam", "params": {"adam_w_mode": False, "torch_adam": True}}}}
    )
    assert adam.engine.optimizer.name == "adam"
    assert "deepspeed.optimizer.params.torch_adam" in adam.notes
    sgd = load_recipe({"deepspeed": {"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}}})
    assert (sgd.engine.optimizer.name, sgd.engine.optimizer.momentum, sgd.train.lr) == ("sgd", 0.9, 0.1)


def test_deepspeed_defaults_apply_inside_a_deepspeed_block():
    recipe = load_recipe(
        {"deepspeed": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}}
    )
    assert recipe.engine.zero.overlap_comm is True  # DeepSpeed: on for stage 3
    assert recipe.engine.zero.offload_optimizer.pin_memory is True
    assert load_recipe({"deepspeed": {}}).engine.zero.stage == 0
    assert load_recipe({}).engine.zero.stage == 1  # zerolaunch's own default without a DeepSpeed block
    legacy = load_recipe({"deepspeed": {"zero_optimization": True}})
    assert legacy.engine.zero.stage == 1 and "legacy" in legacy.notes["deepspeed.zero_optimization"]


def test_schedulers():
    decay = load_recipe(
        {
            "train": {"steps": 50},
            "deepspeed": {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}},
        }
    )
    assert decay.engine.scheduler.total_num_steps == 50 and decay.train.warmup_steps == 5
    cosine_spec = {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "cos_min_ratio": 0.1}}
    # DeepSpeed's default of 1000 warmup steps, longer than the run: allowed (DeepSpeed only warns), noted.
    long = load_recipe({"deepspeed": {"scheduler": cosine_spec}})
    assert long.engine.scheduler.warmup_num_steps == 1000
    assert "ends during warmup" in long.notes["train.warmup_steps"]
    assert "no decay phase" in long.notes["engine.scheduler.total_num_steps"]
    cosine = load_recipe({"train": {"warmup_steps": 10}, "deepspeed": {"scheduler": cosine_spec}})
    assert cosine.engine.scheduler.name == "WarmupCosineLR" and cosine.engine.scheduler.cos_min_ratio == 0.1
    assert cosine.engine.scheduler.total_num_steps == 100 and cosine.engine.scheduler.warmup_num_steps == 10
    # DeepSpeed 0.19.8's WarmupLR defaults when params are absent: 1000 steps up to the optimizer's lr
    # (warmup_max_lr=None in its __init__), WarmupDecayLR up to 0.001.
    plain = load_recipe({"train": {"steps": 2000}, "deepspeed": {"scheduler": {"type": "WarmupLR"}}})
    assert plain.engine.scheduler.warmup_num_steps == 1000 and plain.engine.scheduler.warmup_max_lr is None
    plain_decay = load_recipe(
        {"train": {"steps": 2000}, "deepspeed": {"scheduler": {"type": "WarmupDecayLR"}}}
    )
    assert plain_decay.engine.scheduler.warmup_max_lr == 0.001
    # WarmupLR has no total: a warmup longer than the run is allowed with a note.
    short = load_recipe(
        {
            "train": {"steps": 3},
            "deepspeed": {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}},
        }
    )
    assert (
        short.engine.scheduler.warmup_num_steps == 10
        and "before the peak lr" in short.notes["train.warmup_steps"]
    )
    with pytest.raises(RecipeError, match="both choose the schedule"):
        load_recipe({"train": {"lr_schedule": "cosine"}, "deepspeed": {"scheduler": {"type": "WarmupLR"}}})


def test_no_effect_keys_are_accepted_and_noted():
    ds = {
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "wall_clock_breakdown": True,
        "zero_optimization": {
            "stage": 2,
            "round_robin_gradients": True,
            "elastic_checkpoint": True,
            "sub_group_size": 1e9,
        },
    }
    recipe = load_recipe({"deepspeed": ds})
    for key in (
        "zero_force_ds_cpu_optimizer",
        "zero_allow_untested_optimizer",
        "wall_clock_breakdown",
        "zero_optimization.round_robin_gradients",
        "zero_optimization.elastic_checkpoint",
        "zero_optimization.sub_group_size",
    ):
        assert "no effect" in recipe.notes[f"deepspeed.{key}"], key


def test_fp16_and_communication_dtype():
    recipe = load_recipe(
        {
            "deepspeed": {
                "fp16": {"enabled": True, "loss_scale_window": 500},
                "communication_data_type": "BF16",
            }
        }
    )
    precision = recipe.engine.precision
    assert (precision.dtype, precision.communication_dtype) == ("fp16", "bf16")
    assert (precision.loss_scale, precision.loss_scale_window, precision.min_loss_scale) == (0.0, 500, 1.0)
    assert recipe.origins["engine.precision.loss_scale_window"] == "file"
    assert recipe.origins["engine.precision.hysteresis"] == "default"


def _table_keys(recipe):
    from zerolaunch.config.schema import flat_items

    return {key for key, _ in flat_items(recipe)}


def test_keys_that_do_nothing_are_noted_not_shown_as_used():
    zero = {
        "stage": 3,
        "contiguous_gradients": True,
        "allgather_bucket_size": 2e8,
        "stage3_gather_16bit_weights_on_model_save": "auto",
    }
    recipe = load_recipe({"deepspeed": {"zero_optimization": zero}})
    notes = recipe.notes
    for key in ("contiguous_gradients", "allgather_bucket_size"):
        assert "no effect" in notes[f"deepspeed.zero_optimization.{key}"]
        assert f"engine.zero.{key}" not in _table_keys(recipe)
        assert f"engine.zero.{key}" not in recipe.origins
        assert not hasattr(recipe.engine.zero, key)  # no option the engine never reads
    # MedicalGPT's "auto": false, as DeepSpeed (it drops "auto" and keeps its default); shown with its origin.
    assert recipe.engine.zero.stage3_gather_16bit_weights_on_model_save is False
    assert recipe.origins["engine.zero.stage3_gather_16bit_weights_on_model_save"] == "auto"
    assert "engine.zero.stage3_gather_16bit_weights_on_model_save" in _table_keys(recipe)


def test_gather_16bit_weights_spellings():
    def gather(zero):
        return load_recipe(
            {"deepspeed": {"zero_optimization": zero}}
        ).engine.zero.stage3_gather_16bit_weights_on_model_save

    assert gather({"stage": 3}) is False
    assert gather({"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}) is True
    assert gather({"stage": 3, "stage3_gather_fp16_weights_on_model_save": True}) is True  # deprecated name
    assert gather({"stage": 3, "gather_16bit_weights_on_model_save": True}) is True  # pydantic field name
    with pytest.raises(RecipeError, match="stage3_gather_16bit_weights_on_model_save"):
        gather({"stage": 3, "stage3_gather_16bit_weights_on_model_save": "yes please"})


def test_max_live_parameters_zero_is_accepted():
    # axolotl's zero3 configs: 0 = no prefetch beyond the unit in use (the engine accepts it too).
    recipe = load_recipe({"deepspeed": {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 0}}})
    assert recipe.engine.zero.stage3_max_live_parameters == 0


def test_deepspeed_field_names_are_honoured_under_their_alias():
    zero = {
        "stage": 3,
        "prefetch_bucket_size": 1234,
        "param_persistence_threshold": 99,
        "max_live_parameters": 5000,
        "max_reuse_distance": 7,
        "gather_16bit_weights_on_model_save": True,
    }
    recipe = load_recipe({"deepspeed": {"zero_optimization": zero}})
    z = recipe.engine.zero
    assert (z.stage3_prefetch_bucket_size, z.stage3_param_persistence_threshold) == (1234, 99)
    assert z.stage3_max_live_parameters == 5000
    assert recipe.origins["engine.zero.stage3_max_live_parameters"] == "file"
    assert "`max_live_parameters`" in recipe.notes["deepspeed.zero_optimization.stage3_max_live_parameters"]
    assert z.stage3_max_reuse_distance == 7
    assert "`max_reuse_distance`" in recipe.notes["deepspeed.zero_optimization.stage3_max_reuse_distance"]
    assert z.stage3_gather_16bit_weights_on_model_save is True
    with pytest.raises(RecipeError, match="both `max_live_parameters` and `stage3_max_live_parameters`"):
        load_recipe(
            {"deepspeed": {"zero_optimization": {"max_live_parameters": 1, "stage3_max_live_parameters": 2}}}
        )


def test_deprecated_cpu_offload_maps_to_offload_optimizer():
    recipe = load_recipe({"deepspeed": {"zero_optimization": {"stage": 2, "cpu_offload": True}}})
    assert recipe.engine.zero.offload_optimizer.device == "cpu"
    assert "cpu_offload" in recipe.notes["deepspeed.zero_optimization.offload_optimizer.device"]
    off = load_recipe({"deepspeed": {"zero_optimization": {"stage": 2, "cpu_offload": False}}})
    assert off.engine.zero.offload_optimizer.device == "none"
    with pytest.raises(RecipeError, match="Keep `offload_optimizer` only"):
        load_recipe(
            {
                "deepspeed": {
                    "zero_optimization": {
                        "stage": 2,
                        "cpu_offload": True,
                        "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"},
                    }
                }
            }
        )


def test_monitor_blocks_resolve_to_train_monitors():
    recipe = load_recipe(
        {
            "train": {"run_dir": "runs/x"},
            "deepspeed": {
                "csv_monitor": {"enabled": True, "output_path": "logs/", "job_name": "j"},
                "tensorboard": {"enabled": False},
            },
        }
    )
    assert recipe.train.monitors == {"csv_monitor": {"dir": "logs/j"}}
    assert "nothing written" in recipe.notes["deepspeed.tensorboard"]
    default = load_recipe({"train": {"run_dir": "runs/x"}, "deepspeed": {"csv_monitor": {"enabled": True}}})
    assert default.train.monitors["csv_monitor"]["dir"] == "runs/x/csv_monitor/DeepSpeedJobName"
    with pytest.raises(RecipeError, match="csv_monitor.output`. Did you mean `output_path`"):
        load_recipe({"deepspeed": {"csv_monitor": {"enabled": True, "output": "x"}}})
    with pytest.raises(RecipeError, match="set by the DeepSpeed monitor blocks"):
        load_recipe({"train": {"monitors": {"csv_monitor": {"dir": "x"}}}})
    with pytest.raises(RecipeError, match="comet monitor"):
        load_recipe({"deepspeed": {"comet": {"enabled": True}}})


def test_keys_deepspeed_removed_are_refused_as_removed():
    with pytest.raises(RecipeError, match="DeepSpeed 0.19.8 removed Progressive Layer Dropping") as err:
        load_recipe({"deepspeed": {"progressive_layer_drop": {"enabled": False}}})
    assert "silently ignore" not in str(err.value)


def test_warmup_shorter_than_deepspeeds_minimum_is_noted():
    recipe = load_recipe(
        {"deepspeed": {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}}
    )
    assert "at least 2 steps" in recipe.notes["engine.scheduler.warmup_num_steps"]


def test_max_reuse_distance_is_honoured_and_defaults_to_zero():
    """Given: the value (and a note saying what it does); absent, even in a DeepSpeed block: 0 (DeepSpeed's
    default would be 1e9, see the option's docstring); negative: refused naming the key."""
    given = load_recipe({"deepspeed": {"zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 1e9}}})
    assert given.engine.zero.stage3_max_reuse_distance == 1_000_000_000
    assert "stays gathered" in given.notes["engine.zero.stage3_max_reuse_distance"]
    absent = load_recipe({"deepspeed": {"zero_optimization": {"stage": 3}}})
    assert absent.engine.zero.stage3_max_reuse_distance == 0
    with pytest.raises(RecipeError, match="stage3_max_reuse_distance"):
        load_recipe({"deepspeed": {"zero_optimization": {"stage": 3, "stage3_max_reuse_distance": -1}}})


def _warmup(params, kind="WarmupLR"):
    return {"train": {"steps": 20}, "deepspeed": {"scheduler": {"type": kind, "params": params}}}


def test_per_group_scheduler_lists_are_read_and_round_trip(tmp_path):
    import json

    from zerolaunch.config.schema import Recipe
    from zerolaunch.config.table import recipe_rows

    # DeepSpeed's _format_param: a list/tuple is one value per optimizer param group (its length is checked
    # once the engine has its groups), a number is every group's.
    recipe = load_recipe(
        _warmup({"warmup_min_lr": [0, 1e-4], "warmup_max_lr": [1e-2, 5e-3], "warmup_num_steps": 4})
    )
    s = recipe.engine.scheduler
    assert (s.warmup_min_lr, s.warmup_max_lr) == ((0.0, 1e-4), (1e-2, 5e-3))
    decay = load_recipe(_warmup({"warmup_min_lr": [0.001, 0], "warmup_max_lr": 0.05}, "WarmupDecayLR"))
    assert (decay.engine.scheduler.warmup_min_lr, decay.engine.scheduler.warmup_max_lr) == (
        (0.001, 0.0),
        0.05,
    )
    rows = {key: (value, origin) for key, value, origin, _ in recipe_rows(recipe)}
    assert rows["engine.scheduler.warmup_min_lr"] == ("[0.0, 0.0001]", "file")  # `zerolaunch recipe show`
    assert rows["engine.scheduler.warmup_max_lr"] == ("[0.01, 0.005]", "file")
    back = Recipe.from_json(
        json.loads(json.dumps(recipe.to_json()))
    )  # recipe.resolved.json, as workers read it
    assert back.engine == recipe.engine


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (
            {"warmup_min_lr": [0, "1e-4"]},
            r"`deepspeed.scheduler.params.warmup_min_lr` must be a list of numbers \(one per param group\), "
            r"but item 1 is '1e-4'",
        ),
        ({"warmup_max_lr": []}, r"`deepspeed.scheduler.params.warmup_max_lr` is an empty list"),
        ({"warmup_max_lr": [0.01, 0]}, r"`deepspeed.scheduler.params.warmup_max_lr` item 1 must be > 0"),
        ({"warmup_min_lr": [-1e-4, 0]}, r"`deepspeed.scheduler.params.warmup_min_lr` item 0 must be >= 0"),
        ({"warmup_min_lr": [0, float("nan")]}, r"item 1 is nan"),
        ({"warmup_min_lr": [True, 0]}, r"item 0 is True"),
        ({"warmup_max_lr": {"a": 1}}, r"must be a number or a list of numbers \(one per param group\)"),
        ({"warmup_max_lr": -1}, r"`deepspeed.scheduler.params.warmup_max_lr` must be > 0"),
    ],
)
def test_bad_per_group_scheduler_lists_name_the_key(params, match):
    with pytest.raises(RecipeError, match=match) as err:
        load_recipe(_warmup(params))
    assert err.value.exit_code == 2


def test_warmup_cosine_ratios_stay_one_number_as_deepspeed():
    for key in ("warmup_min_ratio", "cos_min_ratio"):
        with pytest.raises(
            RecipeError, match=rf"`deepspeed.scheduler.params.{key}` is a list .* one {key} for every"
        ):
            load_recipe(_warmup({key: [0.1, 0.2]}, "WarmupCosineLR"))
    for kind in (
        "OneCycle",
        "LRRangeTest",
    ):  # their per-group cycle_min_lr / lr_range_test lists: not supported
        with pytest.raises(RecipeError, match=f"DeepSpeed's {kind} scheduler is not supported"):
            load_recipe(_warmup({"cycle_min_lr": [0.1, 0.2]}, kind))


def test_built_in_loop_refuses_a_list_that_is_not_two_groups_before_workers_start():
    from zerolaunch.config.errors import UserError
    from zerolaunch.launch.preflight import check_scheduler_groups

    three = load_recipe(_warmup({"warmup_min_lr": [0, 0, 0]}))
    with pytest.raises(
        UserError,
        match=r"r.yaml: scheduler.params.warmup_min_lr is a list of 3 values \(\[0.0, 0.0, 0.0\]\) "
        r"but the optimizer has 2 param groups \(the default groups: 2, decay and no-decay; 1 with "
        r"train.weight_decay_1d: true\)",
    ):
        check_scheduler_groups(three, "r.yaml")
    check_scheduler_groups(load_recipe(_warmup({"warmup_min_lr": [0, 0]})), "r.yaml")
    one = {**_warmup({"warmup_max_lr": [0.01, 0.02]}), "train": {"steps": 20, "weight_decay_1d": True}}
    with pytest.raises(
        UserError, match=r"list of 2 values .* has 1 param group \(.*train.weight_decay_1d is true"
    ):
        check_scheduler_groups(load_recipe(one), "r.yaml")
    check_scheduler_groups(
        load_recipe({**one, "deepspeed": _warmup({"warmup_max_lr": [0.01]})["deepspeed"]}), "r"
    )


def test_an_error_on_a_field_name_quotes_the_key_and_line_as_written(tmp_path):
    # DeepSpeed's pydantic field name (max_live_parameters) is read as stage3_max_live_parameters; an error
    # about its value must point at what the user wrote, once: `... line 5: ...max_live_parameters`.
    path = tmp_path / "r.yaml"
    path.write_text("train:\n  steps: 2\ndeepspeed:\n  zero_optimization:\n    max_live_parameters: -5\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    message = str(e.value)
    assert message.startswith(
        f"{path} line 5: `deepspeed.zero_optimization.max_live_parameters` must be >= 0"
    )
    assert message.count(" line ") == 1, message


def test_an_error_inside_the_old_bfloat16_block_quotes_it_as_written(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("deepspeed:\n  train_micro_batch_size_per_gpu: 1\n  bfloat16:\n    enabled: maybe\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert str(e.value).startswith(f"{path} line 4: `deepspeed.bfloat16.enabled` must be true or false")
