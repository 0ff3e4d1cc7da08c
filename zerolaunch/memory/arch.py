"""The model facts shape.py (which assembles a ModelShape) and modules.py (which reads them off a real
`nn.Module`) both need: a decoder's sizes (`Arch`), a stage-3 unit (`Unit`) and a linear layer LoRA may adapt (`Linear`). Kept apart so that neither of
those two modules imports the other's internals (shape.py imports modules.py, never the reverse). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerolaunch.util.sizes import EstimateError


@dataclass(frozen=True)
class Arch:
    """Sizes of a GPT-style decoder; enough for the activation estimate."""

    n_layer: int
    d_model: int
    n_head: int
    vocab_size: int
    d_ff: int
    gated_mlp: bool = False
    """A SwiGLU-style MLP (Llama, Mistral, Qwen): act(gate(x)) * up(x), which keeps 4 d_ff-wide tensors."""
    loss_chunk_rows: int | None = None
    """Rows of (tokens, vocab) logits per fp32 cross-entropy chunk (the built-in GPT's chunked loss,
    models/gpt.py chunked_cross_entropy); None = one fp32 cross-entropy over all rows (Hugging Face models)."""
    linear_loss_rows: int | None = None
    """Rows per chunk of the linear + cross-entropy that never holds the logits (`model.args.loss_chunk`,
    memory/linear_loss.py); when set it replaces loss_chunk_rows' logits and loss."""

    def __post_init__(self):
        for k in ("n_layer", "d_model", "n_head", "vocab_size", "d_ff"):
            if getattr(self, k) < 1:
                raise EstimateError(f"model {k} must be >= 1, got {getattr(self, k)}")
        if self.loss_chunk_rows is not None and self.loss_chunk_rows < 1:
            raise EstimateError(f"model loss_chunk_rows must be >= 1 or None, got {self.loss_chunk_rows}")


@dataclass(frozen=True)
class Unit:
    """A stage-3 unit: the parameters gathered together (a transformer block; "" = everything else)."""

    name: str
    param_names: tuple[str, ...]
    """Every parameter the unit owns, trainable and frozen (ModelShape.specs / .frozen say which)."""


@dataclass(frozen=True)
class Linear:
    """A linear layer (nn.Linear, or transformers' Conv1D) that a LoRA adapter may target."""

    module: str
    """Its module path, e.g. "model.layers.0.self_attn.q_proj"."""
    in_features: int
    out_features: int
    head: bool = False
    """The model's output head (lm_head): PEFT's all-linear rule leaves it out."""
