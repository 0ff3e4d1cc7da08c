"""What train.activation_offload moves: the GPU activation peak with the saved tensors in host memory, and the
host bytes they take ([Note: activation offload] in zerolaunch/train/activation_offload.py). Torch-free.

Without activation checkpointing every block's saved tensors and the head's go to pinned host memory as forward
runs. What stays on the GPU: at the loss, the head's tensors (the first brought back), the last block's whose
copies may still be running, and the loss's own peak; in backward, the block computing, the tensors prefetched
ahead of it (at most PREFETCH_BYTES) and that block's working grads. With checkpointing, torch.utils.checkpoint
keeps each block's input itself (its own saved-tensor hooks take precedence inside a block), so only the head's
tensors move: the GPU figure is the checkpointed one, and the host holds the head's tensors.
"""

from __future__ import annotations

from zerolaunch.memory.activations import (
    activation_profile,
    block_saved_bytes,
    head_saved_bytes,
    model_loss_peak_bytes,
)
from zerolaunch.memory.arch import Arch

MIN_OFFLOAD_BYTES = 1 << 20
"""Smaller saved tensors stay on the device: their copies would cost more in launches than they free."""
PREFETCH_BYTES = 1 << 30
"""How far ahead of backward saved tensors are brought back (about one transformer layer's at 7B, mb 8)."""


def _sizes(arch: Arch, setup) -> tuple[int, int, int, int]:
    """(one block's saved bytes, the head's, the loss's peak, a block's working grads in backward)."""
    b, tokens = setup.dtype_bytes, setup.micro_batch * setup.seq_len
    block = block_saved_bytes(arch, tokens, b, setup.micro_batch, setup.seq_len)
    grads = b * tokens * (arch.d_ff + 2 * arch.d_model)
    loss = model_loss_peak_bytes(arch, tokens, b)
    return block, head_saved_bytes(arch, tokens, b), loss, grads


def offloaded_activation_profile(arch: Arch | None, setup, *, checkpointing: bool) -> tuple[int, int] | None:
    """activations.activation_profile's (peak, peak once the loss's tensors are freed) with the saved tensors
    in host memory."""
    if arch is None:
        return None
    if checkpointing:
        return activation_profile(arch, setup, checkpointing=True)
    block, head, loss, grads = _sizes(arch, setup)
    window = min(PREFETCH_BYTES, arch.n_layer * block)
    in_backward = block + window + grads
    return max(head + block + loss, in_backward), in_backward


def offloaded_host_bytes(arch: Arch | None, setup, *, checkpointing: bool) -> int:
    """Pinned host bytes the saved tensors of one micro-batch take (0 when the model's sizes are unknown)."""
    if arch is None:
        return 0
    block, head, _, _ = _sizes(arch, setup)
    return head if checkpointing else arch.n_layer * block + head


def profile_for(setup):
    """The activation profile function estimate-memory uses for `setup` (its activation_offload or not)."""
    return offloaded_activation_profile if getattr(setup, "activation_offload", False) else activation_profile
