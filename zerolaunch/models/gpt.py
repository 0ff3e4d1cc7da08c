"""The built-in GPT: a nanoGPT-style decoder (pre-LN, learned positions, SDPA causal attention, GELU MLP 4x,
token embedding tied to the lm_head, optional biases).

This module owns the model and its initialisation, nothing about how it is trained: it never imports
torch.distributed, and knows nothing of the engine beyond two promises the ZeRO stage 3 engine relies on:
- `model.transformer.h` is an `nn.ModuleList` of `Block`, the natural stage 3 units;
- the model can be built under `torch.device("meta")` and materialised piece by piece with `to_empty()` +
  `reset_parameters()`: `Block.reset_parameters()` initialises its whole block, `GPT.reset_parameters()`
  everything outside the blocks (embeddings, final norm), so no rank needs the whole model at once.
  `init_weights(module)` is the same initialisation for one module's own parameters, ours or torch's.

Labels follow nanoGPT: `labels[b, t]` is the target of position t (the data already shifted it by one);
-100 is ignored. Packed documents (data.tokens with document_mask) come with `position_ids` that restart at 0
per document: they index the position table and make attention block-diagonal causal (document_causal_mask).

Recipe: `model: {builder: zerolaunch.models.gpt:build, args: {size: tiny, vocab_size: 256, seq_len: 64}}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from zerolaunch.models.flex_doc import DocumentBlockMask, flex_available, flex_document_attention
from zerolaunch.models.gpt_sizes import SIZES
from zerolaunch.models.linear_ce import head_loss

INIT_STD = 0.02


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int
    """Longest sequence the position table covers."""
    n_layer: int
    n_head: int
    d_model: int
    dropout: float = 0.0
    bias: bool = True
    """Biases in the Linear and LayerNorm layers (False: GPT-NeoX / LLaMA style, slightly faster)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them (memory for ~30% time)."""
    loss_chunk: int = 0
    """Rows (tokens) per chunk of a linear + cross-entropy that never holds the (B, T, vocab) logits
    (models/linear_ce.py; forward then returns logits None with labels); 0: logits, then a chunked loss."""
    attention: str = "sdpa"
    """The document mask's kernel: sdpa (a (B, 1, T, T) bool mask) or flex (a BlockMask, compiled; CUDA only,
    elsewhere and with dropout the SDPA mask: models/flex_doc.py)."""

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head


@dataclass
class GPTOutput:
    logits: torch.Tensor | None
    """(B, T, vocab_size); None when loss_chunk computed the loss without them."""
    loss: torch.Tensor | None
    """Mean cross-entropy over the labelled positions; None without labels."""


def init_weights(module: nn.Module) -> None:
    """nanoGPT's initialisation of one module's own parameters (children untouched).

    Linear / Embedding ~ N(0, 0.02); residual projections (marked `residual_proj`) are scaled by
    1/sqrt(2 * n_layer) as in GPT-2, so the residual stream's variance does not grow with depth.
    """
    with torch.no_grad():
        if isinstance(module, nn.Linear):
            std = (
                INIT_STD / math.sqrt(2 * module.n_layer)
                if getattr(module, "residual_proj", False)
                else INIT_STD
            )
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        elif isinstance(module, nn.LayerNorm):
            if module.weight is not None:
                nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def _residual_linear(d_in: int, d_out: int, bias: bool, n_layer: int) -> nn.Linear:
    layer = nn.Linear(d_in, d_out, bias=bias)
    layer.residual_proj = True
    layer.n_layer = n_layer
    return layer


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = _residual_linear(cfg.d_model, cfg.d_model, cfg.bias, cfg.n_layer)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attn_mask=None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (
            t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)
        )  # (B, H, T, D)
        if isinstance(attn_mask, DocumentBlockMask):
            y = flex_document_attention(q, k, v, attn_mask)
        else:
            y = self._sdpa(q, k, v, attn_mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_drop(self.proj(y))

    def _sdpa(self, q, k, v, attn_mask):
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,  # (B, 1, T, T) block-diagonal causal, or None for plain causal
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=attn_mask is None,
        )  # (B, H, T, D)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.proj = _residual_linear(4 * cfg.d_model, cfg.d_model, cfg.bias, cfg.n_layer)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))  # (B, T, C)


class Block(nn.Module):
    """One pre-LN transformer layer: x + attn(ln(x)), then x + mlp(ln(x)). A stage 3 unit."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def reset_parameters(self) -> None:
        """Initialise the whole block (a stage 3 unit is materialised and initialised as one)."""
        for m in self.modules():
            init_weights(m)

    def forward(self, x: torch.Tensor, attn_mask=None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attn_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.activation_checkpointing = cfg.activation_checkpointing
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.d_model),
                wpe=nn.Embedding(cfg.seq_len, cfg.d_model),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                ln_f=nn.LayerNorm(cfg.d_model, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # Tied: one tensor serves as token embedding and output projection (GPT-2; saves V*d params).
        self.lm_head.weight = self.transformer.wte.weight
        # On the meta device these are no-ops costing nothing; on a real device they are the init.
        for m in self.modules():
            init_weights(m)

    def reset_parameters(self) -> None:
        """Initialise everything outside the blocks: embeddings (wte is also the lm_head) and ln_f."""
        for name in ("wte", "wpe", "ln_f"):
            init_weights(self.transformer[name])

    def enable_activation_checkpointing(self) -> None:
        """Recompute every block in backward (the loop calls this for train.activation_checkpointing)."""
        self.activation_checkpointing = True

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, each shared tensor once; non_embedding drops the position table (no matmul)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token: 6N + 12*L*H*d_head*T (torchtitan; N without the position table)."""
        cfg = self.config
        t = cfg.seq_len if seq_len is None else seq_len
        return 6 * self.num_params() + 12 * cfg.n_layer * cfg.n_head * cfg.d_head * t

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | None = None,
    ) -> GPTOutput:
        """`position_ids` (B, T) that restart at 0 mark packed documents: positions count from each document's
        start and attention stays inside it (a block-diagonal causal mask). `num_items_in_batch`: the loss is
        the sum over labelled positions divided by it (the loop's global-batch normalization) instead of
        their mean."""
        B, T = input_ids.shape
        if T > self.config.seq_len:
            raise ValueError(
                f"GPT: input of {T} tokens is longer than model seq_len {self.config.seq_len}; "
                f"build the model with seq_len >= {T}"
            )
        attn_mask = None
        if position_ids is None:
            pos = torch.arange(T, device=input_ids.device)  # (T,)
        else:
            pos = position_ids  # (B, T)
            # one mask per batch, shared by every layer (a BlockMask's construction costs a pass over T^2/128^2)
            if (
                self.config.attention == "flex"
                and flex_available(input_ids.device)
                and not self.config.dropout
            ):
                attn_mask = DocumentBlockMask.from_position_ids(position_ids)
            else:
                attn_mask = document_causal_mask(position_ids)
        x = self.transformer.drop(self.transformer.wte(input_ids) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, attn_mask, use_reentrant=False)
            else:
                x = block(x, attn_mask)
        x = self.transformer.ln_f(x)
        if labels is not None and self.config.loss_chunk:
            loss = head_loss(
                self.lm_head,
                x.view(B * T, -1),
                labels.reshape(-1),
                chunk_rows=self.config.loss_chunk,
                divisor=num_items_in_batch,
            )
            return GPTOutput(logits=None, loss=loss)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = chunked_cross_entropy(
                logits.view(-1, logits.size(-1)), labels.reshape(-1), divisor=num_items_in_batch
            )
        return GPTOutput(logits=logits, loss=loss)


def document_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool, True where query t may attend key s: s <= t and both in the same document (a
    document starts where position_ids is 0). SDPA takes it on every device; the CPU runs it too."""
    doc = (position_ids == 0).cumsum(dim=1)  # (B, T): document number of each token
    T = position_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=position_ids.device).tril()  # (T, T)
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]  # (B, 1, T, T)


CE_CHUNK_ELEMENTS = 1 << 26
"""Logit elements per cross-entropy chunk: 256 MiB of fp32 at a time (vocab 50304: ~1.3k rows)."""


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean fp32 cross-entropy of (N, V) logits, forward and backward a chunk of rows at a time.

    Forward sums F.cross_entropy over fp32 chunk copies and keeps nothing but the logits it was given (alive
    anyway as the lm_head output); backward recomputes each chunk's softmax from them and writes (softmax -
    one_hot) * grad / count straight into one gradient tensor of the logits' dtype (the multiply and the
    rounding in one pass). At no time are more than two fp32 chunks alive on top of the logits and their
    gradient, and nothing is zero-padded: an earlier version ran each chunk under checkpoint, and each
    slice's backward was a full-size zero-padded (N, V) tensor added into the sum (3 full tensors at once;
    at 350M it cost 11 ms of a 108 ms step, bench/RESULTS.md).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, rows: int, divisor) -> torch.Tensor:
        total = logits.new_zeros((), dtype=torch.float32)
        for start in range(0, logits.shape[0], rows):
            chunk = logits[start : start + rows].float()
            total += F.cross_entropy(chunk, labels[start : start + rows], ignore_index=-100, reduction="sum")
            del chunk  # before the next chunk's copy exists
        count = (labels != -100).sum() if divisor is None else divisor.to(torch.float32)
        ctx.save_for_backward(logits, labels, count)
        ctx.rows = rows
        # 0 labelled rows give 0/0 = nan, as F.cross_entropy(reduction="mean") does
        return total / count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels, count = ctx.saved_tensors
        valid = labels != -100
        safe = labels.masked_fill(~valid, 0)  # ignored rows index class 0; their weight is 0
        weight = valid.to(torch.float32).mul_(grad_out.float() / count)[:, None]
        minus_one = torch.full((ctx.rows, 1), -1.0, dtype=torch.float32, device=logits.device)
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.rows):
            stop = start + ctx.rows
            probs = torch.softmax(logits[start:stop].float(), dim=1)
            probs.scatter_add_(1, safe[start:stop, None], minus_one[: probs.shape[0]])  # - one_hot
            torch.mul(probs, weight[start:stop], out=grad[start:stop])
            del probs
        return grad, None, None, None


def chunked_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, divisor: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean cross-entropy (or its sum / `divisor` when given) over labels != -100 of (N, V) logits, computed in fp32 a chunk of rows at a time.

    Why: `F.cross_entropy(logits.float())` holds the fp32 copy of all N x V logits and its fp32 log-softmax
    (saved for backward) at once -- ~6.6 GB at micro batch 8, seq 2048, vocab 50304; here the fp32 extra is
    two chunks (_ChunkedCrossEntropy). The value equals F.cross_entropy on the fp32 logits to fp32 rounding,
    and so do the gradients (computed in fp32, rounded once to the logits' dtype).
    """
    v = logits.shape[1]
    rows = max(1, CE_CHUNK_ELEMENTS // max(v, 1))
    if divisor is not None and not torch.is_tensor(divisor):
        divisor = torch.tensor(float(divisor), device=logits.device)
    return _ChunkedCrossEntropy.apply(logits, labels, rows, divisor)


def build(
    size: str = "tiny",
    vocab_size: int = 256,
    seq_len: int = 128,
    dropout: float = 0.0,
    activation_checkpointing: bool = False,
    bias: bool = True,
    loss_chunk: int = 0,
    attention: str = "sdpa",
    **overrides,
) -> GPT:
    """A GPT of a named size; `overrides` (n_layer, n_head, d_model) replace the size's values."""
    if size not in SIZES:
        raise ValueError(f"GPT size {size!r} is unknown; choose one of {', '.join(SIZES)}")
    unknown = sorted(set(overrides) - {"n_layer", "n_head", "d_model"})
    if unknown:
        raise ValueError(
            f"GPT build got unknown argument(s) {', '.join(unknown)}; known: size, vocab_size, seq_len, "
            "dropout, activation_checkpointing, bias, loss_chunk, attention, n_layer, n_head, d_model"
        )
    cfg = GPTConfig(
        vocab_size=vocab_size,
        seq_len=seq_len,
        dropout=dropout,
        bias=bias,
        activation_checkpointing=activation_checkpointing,
        loss_chunk=loss_chunk,
        attention=attention,
        **SIZES[size],
    )
    cfg = replace(cfg, **overrides)
    for name in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"GPT {name} must be a positive int, got {value!r}")
    if cfg.d_model % cfg.n_head:
        raise ValueError(f"GPT d_model {cfg.d_model} must be divisible by n_head {cfg.n_head}")
    if isinstance(cfg.loss_chunk, bool) or not isinstance(cfg.loss_chunk, int) or cfg.loss_chunk < 0:
        raise ValueError(
            f"GPT loss_chunk must be an int >= 0 (tokens per loss chunk, 0 = off), got {cfg.loss_chunk!r}"
        )
    if cfg.attention not in ("sdpa", "flex"):
        raise ValueError(f"GPT attention must be sdpa or flex, got {cfg.attention!r}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"GPT dropout must be in [0, 1), got {cfg.dropout!r}")
    return GPT(cfg)


build.meta_init = True  # every parameter is initialised by a reset_parameters(): stage 3 may build on meta
