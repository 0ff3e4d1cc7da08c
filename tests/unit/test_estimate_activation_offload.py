"""estimate-memory with train.activation_offload: the saved activations priced in host memory, not the GPU's.

Tests (GPT-1.3B's shape at seq 2048, micro batch 8, bf16, 2 GPUs a node): without checkpointing every row's
GPU peak drops and its host bytes per node rise by the saved tensors of every block and the final norm, counted
here from the activation formula (9h + 2 d_ff compute-dtype values a token per block, fp32 norm statistics and
attention log-sum-exp; the final norm's input and output); with checkpointing the GPU figure is unchanged and
only the final norm's tensors move. Leaves out: the CUDA measurement (bench/ on the device).
"""

from __future__ import annotations

from _estimate_setup import bf16_setup

from zerolaunch.memory.estimate import estimate
from zerolaunch.memory.shape import from_gpt_size

L, H, HEADS, B, S = 24, 2048, 32, 8, 2048
T = B * S
BLOCK = 2 * T * (9 * H + 2 * 4 * H) + 4 * T * 4 + 4 * B * HEADS * S
HEAD = 2 * T * 2 * H + 8 * T
GPUS = 2


def _rows(**kw):
    shape = from_gpt_size("1.3b", seq_len=S)
    setup = bf16_setup(gpus_per_node=GPUS, micro_batch=B, seq_len=S, **kw)
    return {(r.stage, r.offload): r for r in estimate(shape, setup).rows}


def test_offload_moves_the_saved_activations_to_the_host():
    plain, off = _rows(), _rows(activation_offload=True)
    for key, row in plain.items():
        assert off[key].gpu_total_bytes < row.gpu_total_bytes - L * BLOCK // 2, key
        assert off[key].cpu_node_bytes - row.cpu_node_bytes == GPUS * (L * BLOCK + HEAD), key


def test_with_checkpointing_only_the_final_norm_moves():
    plain = _rows(activation_checkpointing=True)
    off = _rows(activation_checkpointing=True, activation_offload=True)
    for key, row in plain.items():
        assert off[key].gpu_total_ckpt_bytes == row.gpu_total_ckpt_bytes, key
        assert off[key].cpu_node_bytes - row.cpu_node_bytes == GPUS * HEAD, key
