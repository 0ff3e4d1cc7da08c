"""The built-in GPT (zerolaunch/models/gpt.py).

Covers: output shapes and a loss near log(vocab) at init; causality (a later token never changes an
earlier position's logits); tied embedding / lm_head; the size table and parameter count; the FLOPs formula;
building on the meta device and materialising one block at a time with reset_parameters(); activation
checkpointing giving the same grads; bad arguments as clear errors. Leaves out: training (e2e tests).
"""

import math

import pytest
import torch

from zerolaunch.models import gpt


def _tiny(**kw):
    torch.manual_seed(0)
    return gpt.build("tiny", vocab_size=97, seq_len=16, **kw)


def test_forward_shapes_and_initial_loss_near_uniform():
    model = _tiny()
    ids = torch.randint(0, 97, (3, 11))
    labels = torch.randint(0, 97, (3, 11))  # not ids: tied weights favour predicting the input token
    out = model(ids, labels=labels)
    assert out.logits.shape == (3, 11, 97)
    assert out.loss.dim() == 0
    assert abs(out.loss.item() - math.log(97)) < 0.3  # std 0.02 init: near-uniform predictions
    assert model(ids).loss is None


def test_causal_later_tokens_do_not_change_earlier_logits():
    model = _tiny().eval()
    ids = torch.randint(0, 97, (1, 12))
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 97
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_lm_head_is_tied_and_counted_once():
    model = _tiny()
    assert model.lm_head.weight is model.transformer.wte.weight
    unique = {id(p): p for p in model.parameters()}
    assert model.num_params(non_embedding=False) == sum(p.numel() for p in unique.values())
    assert model.num_params() == model.num_params(non_embedding=False) - 16 * 64


def test_transformer_h_is_a_modulelist_of_blocks_and_sizes_match_table():
    for size, spec in gpt.SIZES.items():
        with torch.device("meta"):
            model = gpt.build(size, vocab_size=50304, seq_len=2048)
        assert isinstance(model.transformer.h, torch.nn.ModuleList)
        assert len(model.transformer.h) == spec["n_layer"]
        assert all(isinstance(b, gpt.Block) for b in model.transformer.h)
        assert model.transformer.wte.weight.shape == (50304, spec["d_model"])
    with torch.device("meta"):
        m125 = gpt.build("125m", vocab_size=50304, seq_len=1024)
    assert 120e6 < m125.num_params() < 130e6  # GPT-2 small: 124M with a 50257 vocab


def test_flops_per_token_formula():
    model = _tiny()
    cfg = model.config
    expected = 6 * model.num_params() + 12 * cfg.n_layer * cfg.n_head * (cfg.d_model // cfg.n_head) * 16
    assert model.flops_per_token(16) == expected
    assert model.flops_per_token(8) < expected


def test_meta_build_then_materialise_block_by_block_matches_init_statistics():
    with torch.device("meta"):
        model = gpt.build("tiny", vocab_size=97, seq_len=16)
    assert all(p.is_meta for p in model.parameters())
    torch.manual_seed(1)
    for block in model.transformer.h:
        block.to_empty(device="cpu")
        block.reset_parameters()
    assert not any(p.is_meta for b in model.transformer.h for p in b.parameters())
    assert model.transformer.wte.weight.is_meta  # the root's own params untouched so far
    for name in ("wte", "wpe", "ln_f"):
        model.transformer[name].to_empty(device="cpu")
    model.lm_head.weight = model.transformer.wte.weight  # to_empty replaced the tensor: re-tie
    model.reset_parameters()
    block = model.transformer.h[0]
    assert torch.equal(block.ln_1.weight, torch.ones(64))
    assert abs(block.attn.qkv.weight.std().item() - 0.02) < 0.003
    # residual projections are scaled by 1/sqrt(2 * n_layer)
    assert abs(block.mlp.proj.weight.std().item() - 0.02 / 2) < 0.002
    assert torch.equal(block.mlp.proj.bias, torch.zeros(64))
    ids = torch.randint(0, 97, (2, 9))
    assert torch.isfinite(model(ids, labels=ids).loss)


def test_activation_checkpointing_gives_the_same_grads():
    ids = torch.randint(0, 97, (2, 16))
    plain, ckpt = _tiny(), _tiny()
    ckpt.enable_activation_checkpointing()
    for m in (plain, ckpt):
        m(ids, labels=ids).loss.backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-6, msg=name)


def test_no_bias_option():
    model = _tiny(bias=False)
    assert all(not n.endswith("bias") for n, _ in model.named_parameters())


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"size": "2b"}, "tiny"),
        ({"size": "tiny", "n_heads": 3}, "n_heads"),
        ({"size": "tiny", "d_model": 65}, "divisible"),
        ({"size": "tiny", "seq_len": 0}, "seq_len"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, words):
    with pytest.raises(ValueError, match=words):
        gpt.build(**kwargs)


def test_too_long_input_is_a_clear_error():
    model = _tiny()
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_model_never_imports_torch_distributed():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(gpt.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [n for n in names if n.startswith("torch.distributed")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_cross_entropy_equals_full_fp32_cross_entropy(monkeypatch, dtype):
    # 7 elements per chunk at vocab 3 -> 2 rows a chunk over 11 rows: several chunks and a ragged last one
    monkeypatch.setattr(gpt, "CE_CHUNK_ELEMENTS", 7)
    torch.manual_seed(0)
    base = torch.randn(11, 3).to(dtype)
    labels = torch.tensor([0, 2, -100, 1, 1, -100, 0, 2, 2, 1, -100])
    a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(a.float(), labels, ignore_index=-100)
    got = gpt.chunked_cross_entropy(b, labels)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    ref.backward()
    got.backward()
    assert b.grad.dtype == dtype
    torch.testing.assert_close(
        b.grad.float(), a.grad.float(), rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-2
    )


def test_gpt_loss_and_grads_unchanged_by_chunking(monkeypatch):
    ids = torch.randint(0, 97, (2, 16))
    labels = ids.clone()
    labels[0, :3] = -100
    grads, losses = [], []
    for elements in (1 << 27, 97 * 5):  # one chunk vs 7 chunks of 5 rows over 32 rows
        monkeypatch.setattr(gpt, "CE_CHUNK_ELEMENTS", elements)
        m = _tiny()
        out = m(ids, labels=labels)
        ref = torch.nn.functional.cross_entropy(out.logits.float().view(-1, 97), labels.view(-1))
        torch.testing.assert_close(out.loss, ref, rtol=0, atol=1e-6)
        out.loss.backward()
        losses.append(out.loss.item())
        grads.append([p.grad.clone() for p in m.parameters()])
    assert abs(losses[0] - losses[1]) < 1e-6
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
