"""Model FLOPs arithmetic: the peak FLOP/s of known accelerators and the FLOPs a GPT spends per token.

This module owns the table of peak dense FLOP/s (no 2:4 sparsity: the figure a training step can reach) and
the torchtitan / PaLM formula for training FLOPs per token. It does not measure anything and imports neither
torch nor rich, so the CLI can use it without start-up cost. Device names are matched against the string
`torch.cuda.get_device_name()` returns (e.g. "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

TERA = 1e12

# The dtype spellings accepted by `peak_flops`, mapped to the column of the peak table they read.
_DTYPE_COLUMN = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "tf32": "tf32",
}


@dataclass(frozen=True)
class DevicePeak:
    """Peak dense TFLOP/s of one accelerator, from its vendor data sheet."""

    name: str
    """Human name shown in the throughput table."""
    pattern: str
    """Regular expression searched (case-insensitive) in the device name; word bounds keep A10 off A100."""
    bf16_tflops: float | None
    fp16_tflops: float | None
    fp32_tflops: float
    """Plain fp32 (CUDA cores): what torch runs unless `allow_tf32` is switched on."""
    tf32_tflops: float | None


# Order matters: the first pattern found in the device name wins, so specific names (H100 PCIe, H100 NVL)
# come before the generic one (H100, which is the SXM part).
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("B200", r"\bB200\b", 2250.0, 2250.0, 80.0, 1100.0),
    DevicePeak("H200 / GH200", r"H200\b", 989.0, 989.0, 67.0, 494.0),
    DevicePeak("H100 PCIe", r"\bH100\b.*\bPCIe\b", 756.0, 756.0, 51.0, 378.0),
    DevicePeak("H100 NVL", r"\bH100\b.*\bNVL\b", 835.0, 835.0, 60.0, 418.0),
    DevicePeak("H100 SXM", r"\bH100\b", 989.0, 989.0, 67.0, 494.0),
    DevicePeak("H800", r"\bH800\b", 989.0, 989.0, 67.0, 494.0),
    DevicePeak("A100", r"\bA100\b", 312.0, 312.0, 19.5, 156.0),
    DevicePeak("A800", r"\bA800\b", 312.0, 312.0, 19.5, 156.0),
    DevicePeak("L40S", r"\bL40S\b", 362.0, 362.0, 91.6, 183.0),
    DevicePeak("L40", r"\bL40\b", 181.0, 181.0, 90.5, 90.5),
    DevicePeak("L4", r"\bL4\b", 121.0, 121.0, 30.3, 60.0),
    DevicePeak("A10G", r"\bA10G\b", 125.0, 125.0, 31.2, 62.5),
    DevicePeak("A10", r"\bA10\b", 125.0, 125.0, 31.2, 62.5),
    DevicePeak("RTX 4090", r"\b4090\b", 165.0, 165.0, 82.6, 82.6),
    DevicePeak("RTX 3090", r"\b3090\b", 71.0, 71.0, 35.6, 35.6),
    DevicePeak("RTX A6000", r"\bA6000\b", 155.0, 155.0, 38.7, 77.4),
    DevicePeak("V100", r"\bV100\b", None, 125.0, 15.7, None),
    DevicePeak("T4", r"\bT4\b", None, 65.0, 8.1, None),
    DevicePeak("MI300X", r"\bMI300X\b", 1307.0, 1307.0, 163.4, 653.7),
    DevicePeak("MI250X", r"\bMI250X?\b", 383.0, 383.0, 47.9, None),
)


def find_device(device_name: str) -> DevicePeak | None:
    """The table row whose pattern occurs in `device_name`, or None (CPU, unknown accelerator)."""
    for peak in PEAKS:
        if re.search(peak.pattern, device_name, flags=re.IGNORECASE):
            return peak
    return None


def dtype_column(dtype) -> str:
    """'bf16' | 'fp16' | 'fp32' | 'tf32' for a dtype given as a recipe string or a torch.dtype."""
    key = str(dtype).strip().lower()
    if key not in _DTYPE_COLUMN:
        known = ", ".join(sorted({"bf16", "fp16", "fp32", "tf32"}))
        raise ValueError(f"unknown dtype {dtype!r} for the peak FLOP/s table; use one of {known}")
    return _DTYPE_COLUMN[key]


def peak_flops(device_name: str, dtype) -> float | None:
    """Peak dense FLOP/s (not TFLOP/s) of one device in `dtype`, or None when unknown (CPU included).

    None rather than a guess: an MFU computed against a made-up peak is worse than "n/a".
    """
    peak = find_device(device_name)
    if peak is None:
        return None
    tflops = getattr(peak, f"{dtype_column(dtype)}_tflops")
    return None if tflops is None else tflops * TERA


def gpt_flops_per_token(n_params: int, n_layer: int, n_head: int, d_head: int, seq_len: int) -> int:
    """Training FLOPs per token of a GPT decoder: 6N + 12*L*H*d_head*T (torchtitan, PaLM appendix B).

    6N counts forward (2N) + backward (4N) of every weight matmul; the second term is the attention scores
    and the weighted sum, which do not depend on N. N should count the weights that take part in a matmul
    per token: embedding lookups (positions, an untied token embedding) do none; a tied lm_head does.
    """
    for name, value in (
        ("n_params", n_params),
        ("n_layer", n_layer),
        ("n_head", n_head),
        ("d_head", d_head),
        ("seq_len", seq_len),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"gpt_flops_per_token: {name} must be a non-negative int, got {value!r}")
    return 6 * n_params + 12 * n_layer * n_head * d_head * seq_len


# Hugging Face model types whose decoder layer is q/k/v/o projections plus a gated MLP (gate, up, down), the
# shape `hf_flops_per_token` counts. Others get None (MFU "n/a") rather than a count of a different network.
GATED_MLP_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "olmo2"})


def hf_flops_per_token(config: dict, seq_len: int) -> int | None:
    """Training FLOPs per token of a Hugging Face decoder from its config dict: 6*N_matmul + 12*L*H*d_head*T.

    N_matmul per layer: q and o (hidden x heads*d_head each), k and v (hidden x kv_heads*d_head each, so
    grouped-query attention counts what it computes) and the gated MLP's three hidden x intermediate
    matrices; plus the lm_head (hidden x vocab, tied or not: it is a matmul either way). The token embedding is
    a lookup and norms / biases are not matmuls. None for a model type outside GATED_MLP_MODEL_TYPES or a
    config without the sizes.
    """
    if config.get("model_type") not in GATED_MLP_MODEL_TYPES:
        return None
    try:
        layers = int(config["num_hidden_layers"])
        hidden = int(config["hidden_size"])
        inter = int(config["intermediate_size"])
        heads = int(config["num_attention_heads"])
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(config.get("num_key_value_heads") or heads)
    d_head = int(config.get("head_dim") or hidden // heads)
    per_layer = 2 * hidden * heads * d_head + 2 * hidden * kv_heads * d_head + 3 * hidden * inter
    n_matmul = layers * per_layer + hidden * vocab
    return gpt_flops_per_token(n_matmul, layers, heads, d_head, seq_len)


def flops_per_second(flops_per_token: float, tokens: float, seconds: float) -> float | None:
    """Achieved FLOP/s for `tokens` processed in `seconds`, or None when the time is not positive."""
    if not seconds > 0 or not math.isfinite(seconds):
        return None
    return flops_per_token * tokens / seconds


def mfu(achieved_flops_per_second: float | None, peak_flops_per_second: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction (0.42 = 42%), or None when either side is unknown."""
    if achieved_flops_per_second is None or not peak_flops_per_second:
        return None
    return achieved_flops_per_second / peak_flops_per_second
