"""A Hugging Face causal LM whose training loss never holds the (B, T, vocab) logits (`model.args.loss_chunk`).

HF's causal LMs compute `logits = lm_head(hidden)` for every position, then `ForCausalLMLoss` upcasts them to
fp32 and shifts the labels: at 32k tokens and Llama 3's 128k vocabulary that is 8 GiB of bf16 logits and
three fp32 copies in the loss. With a chunk size the model's forward, when it is given labels, calls the
base model for the hidden states and then the chunked linear + cross-entropy (models/linear_ce.py) through
the lm_head module (so a ZeRO-3 unit holding it gathers its weight as for its own forward). In eval mode, and
without labels, the model's own forward runs (evaluation metrics and predict() read the logits). It keeps HF's
loss rule exactly: labels shifted by one with -100 padding (or `shift_labels` as given), the sum over
labelled positions divided by `num_items_in_batch` when given (the loop's global-batch normalization,
train/loss_norm.py), else their mean.

Models whose logits are not `lm_head(hidden)` (a final soft-capping or a logit scale) are refused when built.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from zerolaunch.models.linear_ce import IGNORE_INDEX, head_loss

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def enable_chunked_loss(model: nn.Module, chunk_rows: int) -> None:
    """Replace `model.forward` (an HF causal LM) by one whose labelled forward uses the chunked loss."""
    config = model.config
    for key in _LOGIT_TRANSFORMS:
        if getattr(config, key, None) not in (None, 1, 1.0):
            raise ValueError(
                f"model.args.loss_chunk: {type(model).__name__} transforms its logits ({key}: "
                f"{getattr(config, key)}); the chunked loss computes lm_head(hidden) only. Remove loss_chunk"
            )
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ValueError(
            f"model.args.loss_chunk: {type(model).__name__}'s output layer is not a Linear without bias; "
            "remove loss_chunk"
        )
    model_forward = model.forward

    def forward(
        input_ids=None, attention_mask=None, position_ids=None, labels=None, num_items_in_batch=None, **kwargs
    ):
        shift_labels = kwargs.pop("shift_labels", None)
        # evaluation and prediction keep HF's forward: callers there read the logits (metrics, predict())
        if (labels is None and shift_labels is None) or not model.training:
            if num_items_in_batch is not None:
                kwargs["num_items_in_batch"] = num_items_in_batch
            if shift_labels is not None:
                kwargs["shift_labels"] = shift_labels
            return model_forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                labels=labels,
                **kwargs,
            )
        for unused in ("logits_to_keep", "return_dict", "use_cache"):
            kwargs.pop(unused, None)
        outputs = model.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        hidden = outputs[0]  # (B, T, d)
        if shift_labels is None:
            # position t predicts labels[t + 1]; the last position predicts nothing (HF's ForCausalLMLoss)
            shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        loss = head_loss(
            model.get_output_embeddings(),
            hidden.reshape(-1, hidden.shape[-1]),
            shift_labels.reshape(-1).to(hidden.device),
            chunk_rows=chunk_rows,
            divisor=num_items_in_batch,
        )
        from transformers.modeling_outputs import CausalLMOutputWithPast

        return CausalLMOutputWithPast(
            loss=loss,
            logits=None,
            hidden_states=getattr(outputs, "hidden_states", None),
            attentions=getattr(outputs, "attentions", None),
        )

    model.forward = forward
    model.zerolaunch_loss_chunk = chunk_rows  # what estimate-memory prices (memory/linear_loss.py)
