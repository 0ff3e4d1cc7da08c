"""`zerolaunch convert-checkpoint SRC OUT`: consolidate a zerolaunch or DeepSpeed ZeRO checkpoint.

    zerolaunch convert-checkpoint runs/x/checkpoints out/                 # out/model.safetensors (fp32)
    zerolaunch convert-checkpoint ds_ckpt/ out/ --dtype bf16 --max-shard-size 5GB   # HF shards + index
    zerolaunch convert-checkpoint runs/x/checkpoints/step_000100 out/ --format torch
    zerolaunch convert-checkpoint runs/x/checkpoints new_ckpt/ --to-world-size 3   # reshard for 3 ranks
    zerolaunch convert-checkpoint runs/lora/checkpoints merged/ --merge-adapter   # a `peft:` run, merged

typer + rich only at import; the work is zerolaunch.checkpoint.convert. Bad input -> one red line, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import typer

from .errors import user_errors


def register(app: typer.Typer) -> None:
    @app.command("convert-checkpoint")
    def convert_checkpoint_command(
        src: Path = typer.Argument(
            ...,
            help="A zerolaunch checkpoint (a step_* folder, or the checkpoint "
            "dir with `latest`) or a DeepSpeed ZeRO checkpoint (save dir or tag).",
        ),
        out: Path = typer.Argument(..., help="Output folder (or a single .safetensors/.bin file)."),
        fmt: str = typer.Option("safetensors", "--format", help="safetensors | torch."),
        dtype: str = typer.Option("fp32", "--dtype", help="fp32 | bf16 | fp16 (floating tensors only)."),
        max_shard_size: str = typer.Option(
            None,
            "--max-shard-size",
            help="Split into HF-style shards + index past this size: 5GB, 200MB, 512MiB "
            "(GB = 10^9 bytes, GiB = 2^30 bytes). Default for a folder: save_pretrained's (50GB in "
            "transformers 5), split where save_pretrained splits.",
        ),
        to_world_size: int = typer.Option(
            None, "--to-world-size", help="Write a zerolaunch checkpoint resharded for N ranks instead."
        ),
        merge_adapter: bool = typer.Option(
            False,
            "--merge-adapter",
            help="A run with a `peft:` block: write the base model with the adapter merged in (a plain HF "
            "folder) instead of the adapter folder.",
        ),
        force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
        verify: bool = typer.Option(
            True,
            "--verify/--no-verify",
            help="Check each tensor against the manifest's crc32 while reading (zerolaunch checkpoints).",
        ),
    ) -> None:
        """Convert a checkpoint to model.safetensors (or shards, or torch), or reshard it."""
        with user_errors():
            from rich.console import Console

            from zerolaunch.checkpoint.convert import convert_checkpoint, parse_size

            max_bytes = parse_size(max_shard_size) if max_shard_size is not None else None
            if to_world_size is not None and (
                max_bytes is not None or fmt != "safetensors" or dtype != "fp32" or merge_adapter
            ):
                from zerolaunch.checkpoint.errors import CheckpointError

                raise CheckpointError(
                    "--to-world-size writes a zerolaunch checkpoint: it takes none of "
                    "--format, --dtype, --max-shard-size, --merge-adapter"
                )
            console = Console(stderr=True, highlight=False)
            written = convert_checkpoint(
                src,
                out,
                fmt=fmt,
                dtype=dtype,
                max_shard_bytes=max_bytes,
                to_world_size=to_world_size,
                force=force,
                progress=progress and console.is_terminal,
                verify=verify,
                merge_adapter=merge_adapter,
            )
            files = sorted(p.name for p in written.iterdir()) if written.is_dir() else [written.name]
            shown = ", ".join(files[:4]) + (f", ... ({len(files)} files)" if len(files) > 4 else "")
            console.print(f"wrote {written}: {shown}")
