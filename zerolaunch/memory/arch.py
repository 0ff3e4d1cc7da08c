"""The model facts shape.py (which assembles a ModelShape) and modules.py (which reads them off a real
`nn.Module`) both need: a decoder's sizes (`Arch`) and a stage-3 unit (`Unit`). Kept apart so that neither of
those two modules imports the other's internals (shape.py imports modules.py, never the reverse). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerolaunch.memory.sizes import EstimateError


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

    def __post_init__(self):
        for k in ("n_layer", "d_model", "n_head", "vocab_size", "d_ff"):
            if getattr(self, k) < 1:
                raise EstimateError(f"model {k} must be >= 1, got {getattr(self, k)}")


@dataclass(frozen=True)
class Unit:
    """A stage-3 unit: the parameters gathered together (a transformer block; "" = everything else)."""

    name: str
    param_names: tuple[str, ...]
