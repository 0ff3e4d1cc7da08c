"""What document_mask costs in attention on a GPU: SDPA causal vs SDPA with the block-diagonal bool mask (what the
built-in GPT does with position_ids) vs flex_attention with a block mask (compiled), forward + backward of one
layer's attention, B 8, heads 12, seq 2048, head dim 64, bf16, documents of 512 tokens.

    python bench/attention_doc_mask.py        # needs CUDA; pure torch

The measurement behind docs/data.md's note on the default (bench/RESULTS.md, 2026-12-06).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


def _ms(fn, n: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / n


def main() -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dev, (B, H, T, D) = "cuda", (8, 12, 2048, 64)
    q, k, v = (
        torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    pos = (torch.arange(T, device=dev) % 512).expand(B, T).contiguous()
    doc = (pos == 0).cumsum(1)  # (B, T) document number
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    mask = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]  # (B, 1, T, T)

    def sdpa(m):
        return lambda: (
            F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=m is None).sum().backward()
        )

    def mask_mod(b, h, qi, ki):
        return (ki <= qi) & (doc[b, qi] == doc[b, ki])

    flex = torch.compile(flex_attention)
    block_mask = create_block_mask(mask_mod, B, None, T, T, device=dev)

    def flex_reused():
        flex(q, k, v, block_mask=block_mask).sum().backward()

    def flex_built():
        flex(q, k, v, block_mask=create_block_mask(mask_mod, B, None, T, T, device=dev)).sum().backward()

    rows = [
        ("SDPA causal (no document mask)", _ms(sdpa(None))),
        ("SDPA + bool document mask", _ms(sdpa(mask))),
        ("flex_attention, block mask reused", _ms(flex_reused)),
        ("flex_attention, block mask built per call", _ms(flex_built)),
    ]
    print(torch.cuda.get_device_name(), torch.__version__, f"B{B} H{H} T{T} D{D} bf16, documents of 512")
    for name, ms in rows:
        print(f"{name:<44} {ms:7.2f} ms forward+backward ({ms / rows[0][1]:.2f}x)")


if __name__ == "__main__":
    main()
