"""Records -> token ids (and loss masks) with a Hugging Face tokenizer, a batch of records at a time.

This module owns the tokenization rules of prepare-data:
- text: the tokenizer's own special-token rules (`add_special_tokens=True`: BOS for Llama-family tokenizers,
  nothing for GPT-2), then one end-of-document token (EOD, the tokenizer's eos) unless the tokenizer already
  ended the document with it.
- prompt-completion: prompt with the special-token rules, completion without, then EOD; loss on the
  completion and the EOD (the model learns to stop), not on the prompt.
- chat: the tokenizer's chat template renders the whole conversation; loss on the tokens of assistant
  messages (found by rendering each prefix of the conversation), then EOD without loss.
It knows nothing of files (readers.py) or of the output folder (prepare.py). `load_tokenizer` reads the
tokenizer those rules apply, from a local folder only.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from zerolaunch.data.readers import DataError, Record, said
from zerolaunch.util.hf_env import hf_offline


class Encoded:
    """A batch of encoded documents: all tokens concatenated, each document's length, and the loss mask
    (1 = the token is a target that carries loss; None in text mode, where every token does)."""

    def __init__(self, tokens: np.ndarray, lengths: np.ndarray, loss_mask: np.ndarray | None):
        self.tokens, self.lengths, self.loss_mask = tokens, lengths, loss_mask


def load_tokenizer(path: str | Path):
    """A tokenizer from a local folder; never downloads (HF_HUB_OFFLINE=1, local_files_only=True)."""
    p = Path(path)
    if not p.is_dir():
        raise DataError(
            f"--tokenizer {p}: not a folder; zerolaunch never downloads: give a local folder saved with "
            "tokenizer.save_pretrained(...)"
        )
    hf_offline()  # before the import: huggingface_hub reads HF_HUB_OFFLINE once, when first imported
    try:
        from transformers import AutoTokenizer  # optional dependency: only a tokenizer needs it
    except ImportError:
        raise ImportError("--tokenizer needs transformers: pip install 'zerolaunch[hf]'") from None
    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError) as e:
        raise DataError(f"--tokenizer {p}: cannot load a tokenizer from it ({said(e)})") from None


def eod_id(tokenizer) -> int:
    eod = tokenizer.eos_token_id
    if eod is None:
        raise DataError(
            f"the tokenizer ({type(tokenizer).__name__}, {tokenizer.name_or_path}) has no eos_token, which "
            "prepare-data puts after each document; set one (tokenizer.eos_token = ...) and save it again"
        )
    return int(eod)


def _ids(tokenizer, texts: list[str], special: bool) -> list[list[int]]:
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=special, return_attention_mask=False)["input_ids"]


def _with_eod(ids: list[int], eod: int) -> list[int]:
    return ids if ids and ids[-1] == eod else [*ids, eod]


def _chat_ids(tokenizer, record: Record) -> tuple[list[int], list[int]]:
    """The conversation's tokens and their loss mask (1 on assistant tokens)."""
    messages = record.messages
    try:
        full = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # jinja errors, or a tokenizer without a chat template (ValueError)
        raise DataError(f"{record.where}: the tokenizer's chat template failed ({said(e)})") from None
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = (
            tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            if i
            else ""
        )
        through = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (full.startswith(through) and through.startswith(before)):
            raise DataError(
                f"{record.where}: the chat template does not render conversations prefix by prefix, so the "
                "assistant tokens cannot be located; use --mode prompt-completion"
            )
        spans.append((len(before), len(through)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [
        int(any(a <= start and end <= b for a, b in spans) and end > start)
        for start, end in enc["offset_mapping"]
    ]
    return list(enc["input_ids"]), mask


def encode(records: list[Record], tokenizer, mode: str, eod: int, dtype) -> Encoded:
    """The tokens of `records`, in order."""
    docs: list[list[int]] = []
    masks: list[list[int]] | None = None
    if mode == "text":
        docs = [_with_eod(ids, eod) for ids in _ids(tokenizer, [r.text for r in records], True)]
    elif mode == "prompt-completion":
        prompts = _ids(tokenizer, [r.prompt for r in records], True)
        completions = _ids(tokenizer, [r.completion for r in records], False)
        masks = []
        for p, c in zip(prompts, completions, strict=True):
            docs.append([*p, *c, eod])
            masks.append([0] * len(p) + [1] * (len(c) + 1))
    else:
        masks = []
        for r in records:
            ids, mask = _chat_ids(tokenizer, r)
            docs.append([*ids, eod])
            masks.append([*mask, 0])
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    tokens = np.fromiter(itertools.chain.from_iterable(docs), dtype=dtype, count=int(lengths.sum()))
    loss_mask = None
    if masks is not None:
        loss_mask = np.fromiter(
            itertools.chain.from_iterable(masks), dtype=np.uint8, count=int(lengths.sum())
        )
    return Encoded(tokens, lengths, loss_mask)
