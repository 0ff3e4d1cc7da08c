"""What `accelerate launch` left in a zerolaunch.hf script's environment, read when its arguments are built.

accelerate passes its launch settings to the script only through environment variables. Two of them change
what the script would do without a word: a DeepSpeed plugin (transformers and accelerate would start
DeepSpeed instead of the engine), and a request for several processes that accelerate's plain launcher
answered with one (on a host without GPUs it starts several only with --multi_gpu)."""

from __future__ import annotations

import os
import sys

from zerolaunch.util.errors import UserError

_TRUE = ("1", "true", "yes")
# a process that an MPI launcher started knows its world size from these (accelerate's --cpu launcher)
_MPI_WORLD_SIZE = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def _rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def deepspeed_plugin_config(given):
    """The config the arguments train with. Under an accelerate DeepSpeed plugin (`distributed_type:
    DEEPSPEED`) its `deepspeed_config_file` is read as TrainingArguments(deepspeed=...) would be, and the
    plugin is switched off for this process, so that DeepSpeed is not started; said in one line. As in
    transformers, a config given to the arguments wins over the plugin's file."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() not in _TRUE:
        return given
    config_file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if given is None and config_file in ("", "none"):
        raise UserError(
            "accelerate launch was given a DeepSpeed plugin without a config file (ACCELERATE_USE_DEEPSPEED=true, "
            "no deepspeed_config_file), but this script trains with zerolaunch's engine, which reads a DeepSpeed "
            "config: name one with `deepspeed_config_file: ds_config.json` in the accelerate config, or launch "
            "without --use_deepspeed and give the ds_config to TrainingArguments(deepspeed=...)"
        )
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "false"
    used = "the config given to TrainingArguments(deepspeed=...)" if given is not None else config_file
    if _rank0():
        print(
            f"zerolaunch.hf: accelerate's DeepSpeed plugin is not started; {used} runs on zerolaunch's engine",
            file=sys.stderr,
            flush=True,
        )
    return given if given is not None else config_file


def warn_if_one_of_several() -> None:
    """accelerate's plain launcher sets MASTER_ADDR/MASTER_PORT when asked for more than one process, yet
    starts one process (no WORLD_SIZE) unless --multi_gpu (or GPUs it counts, or a config) picks torchrun."""
    env = os.environ
    simple_launcher = "ACCELERATE_USE_CPU" in env  # set by that launcher only
    if not simple_launcher or "WORLD_SIZE" in env or any(name in env for name in _MPI_WORLD_SIZE):
        return
    if "MASTER_ADDR" in env or "MASTER_PORT" in env:
        print(
            "zerolaunch.hf: accelerate launch started this script as ONE process, though it was asked for "
            "several (--num_processes > 1 sets MASTER_ADDR/MASTER_PORT): on a host without GPUs accelerate "
            "starts several only with `accelerate launch --multi_gpu --num_processes N` (the script's "
            "use_cpu=True keeps them on the CPU). Training goes on in one process.",
            file=sys.stderr,
            flush=True,
        )
