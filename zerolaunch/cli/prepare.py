"""`zerolaunch prepare-data INPUT... --tokenizer DIR --out DIR`: tokenize a corpus once, for training.

    zerolaunch prepare-data corpus/ --tokenizer tok/ --out data/corpus --num-proc 8
    zerolaunch prepare-data sft.jsonl --tokenizer model/ --out data/sft --mode prompt-completion
    zerolaunch prepare-data chats.parquet --tokenizer model/ --out data/chat --mode chat
    zerolaunch prepare-data --verify data/corpus     # every file's size and crc32 against the manifest

typer only at import; the work is zerolaunch.data.prepare. Bad input -> one red line naming the file and
line, exit 2, and no OUT folder.
"""

from __future__ import annotations

from pathlib import Path

import typer

from .errors import user_errors


def register(app: typer.Typer) -> None:
    @app.command("prepare-data")
    def prepare_data_command(
        inputs: list[Path] = typer.Argument(
            None,
            help="Files or folders: .jsonl, .jsonl.gz, .json (an array), .parquet, .txt, .md, or a "
            "datasets.save_to_disk folder. A folder means its files.",
        ),
        tokenizer: Path = typer.Option(
            None, "--tokenizer", help="A local tokenizer folder (save_pretrained)."
        ),
        out: Path = typer.Option(
            None, "--out", help="The folder to write; it appears complete or not at all."
        ),
        text_key: str = typer.Option("text", "--text-key", help="The field that holds the text (mode text)."),
        num_proc: int = typer.Option(1, "--num-proc", help="Tokenizer processes."),
        mode: str = typer.Option(
            "text",
            "--mode",
            help="text | prompt-completion (fields prompt, completion) | chat (field messages).",
        ),
        force: bool = typer.Option(
            False, "--force", help="Replace OUT if it is a folder an earlier prepare-data wrote."
        ),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Print docs/s, tokens/s, ETA."),
        verify: Path = typer.Option(
            None,
            "--verify",
            help="Check a prepared folder instead: every file's size and crc32 against its manifest "
            "(exit 0 ok, exit 2 naming the bad files).",
        ),
        max_document_bytes: str = typer.Option(
            "8MiB",
            "--max-document-bytes",
            help="Refuse a document longer than this (8MiB, 64MB, or none): the tokenizer holds about 250 "
            "bytes of memory per byte of one document's text.",
        ),
    ) -> None:
        """Tokenize files into memory-mappable token shards + a document index (data.builder zerolaunch.data.tokens:build)."""
        with user_errors():
            from zerolaunch.data.readers import DataError

            if verify is not None:
                from zerolaunch.data.checksums import verify_folder

                if inputs or tokenizer is not None or out is not None:
                    raise DataError(
                        f"--verify {verify} checks a prepared folder and takes no INPUT, --tokenizer or --out; "
                        "run the check and the preparation as two commands"
                    )
                typer.echo(verify_folder(verify))
                return
            missing = [
                name
                for name, v in (("INPUT...", inputs), ("--tokenizer", tokenizer), ("--out", out))
                if not v
            ]
            if missing:
                raise DataError(
                    f"prepare-data needs {', '.join(missing)}: `zerolaunch prepare-data INPUT... --tokenizer DIR "
                    "--out DIR` (or `zerolaunch prepare-data --verify DIR` to check a prepared folder)"
                )
            from zerolaunch.data.prepare import parse_document_limit, prepare_data

            manifest = prepare_data(
                [str(p) for p in inputs],
                tokenizer=tokenizer,
                out=out,
                text_key=text_key,
                num_proc=num_proc,
                mode=mode,
                force=force,
                progress=progress,
                max_document_bytes=parse_document_limit(max_document_bytes),
            )
            typer.echo(
                f"wrote {out}: {manifest['documents']:,} documents, {manifest['tokens']:,} tokens "
                f"({manifest['dtype']}, {len(manifest['shards'])} shard(s))"
            )
