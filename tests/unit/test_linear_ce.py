"""The chunked linear + cross-entropy (zerolaunch/models/linear_ce.py) and the built-in GPT's loss_chunk and
flex document-mask options.

Covers: loss and grads of hidden and weight equal F.cross_entropy on the full fp32 logits (mean, ignored rows,
a global-batch divisor, a last chunk shorter than the others, bf16 within bf16 rounding); the GPT with
loss_chunk equal to the GPT without it (loss and every grad, checkpointing on and off, packed documents);
the flex BlockMask path equal to the SDPA bool mask (output and grads); bad options as clear errors.
Leaves out: ZeRO-3 gathering the weight (tests/dist/test_hf_longseq.py), CUDA speed (bench/longseq.py).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zerolaunch.models import gpt
from zerolaunch.models.flex_doc import DocumentBlockMask, flex_available, flex_document_attention
from zerolaunch.models.linear_ce import head_loss, linear_cross_entropy


def _reference(hidden, weight, labels, divisor=None):
    logits = hidden.float() @ weight.float().t()
    if divisor is None:
        return F.cross_entropy(logits, labels, ignore_index=-100)
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / divisor


def _grads(fn, hidden, weight):
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    loss = fn(h, w)
    (loss * 1.7).backward()  # a grad_out other than 1 must scale both grads
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk_rows", [1, 7, 64])
@pytest.mark.parametrize("divisor", [None, 9.0])
def test_equals_full_fp32_cross_entropy(chunk_rows, divisor):
    torch.manual_seed(0)
    hidden, weight = torch.randn(23, 16), torch.randn(41, 16) * 0.3
    labels = torch.randint(0, 41, (23,))
    labels[[0, 5, 22]] = -100
    got = _grads(
        lambda h, w: linear_cross_entropy(h, w, labels, chunk_rows=chunk_rows, divisor=divisor),
        hidden,
        weight,
    )
    want = _grads(lambda h, w: _reference(h, w, labels, divisor), hidden, weight)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)


def test_bf16_within_bf16_rounding():
    torch.manual_seed(0)
    hidden, weight = torch.randn(32, 16), torch.randn(50, 16) * 0.3
    labels = torch.randint(0, 50, (32,))
    h16, w16 = hidden.bfloat16(), weight.bfloat16()
    got = _grads(lambda h, w: linear_cross_entropy(h, w, labels, chunk_rows=5), h16, w16)
    want = _grads(lambda h, w: _reference(h, w, labels), h16.float(), w16.float())
    assert got[1].dtype == got[2].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for g, r in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g.float(), r, rtol=2e-2, atol=2e-3)


def test_head_loss_runs_the_heads_hooks_and_restores_its_forward():
    head = nn.Linear(8, 13, bias=False)
    calls = []
    head.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    head.register_forward_hook(lambda m, args, out: calls.append("post"))
    hidden, labels = torch.randn(6, 8), torch.randint(0, 13, (6,))
    loss = head_loss(head, hidden, labels, chunk_rows=4)
    assert calls == ["pre", "post"]
    torch.testing.assert_close(loss, _reference(hidden, head.weight, labels))
    assert head(hidden).shape == (6, 13)  # the plain forward is back
    with pytest.raises(ValueError, match="without bias"):
        head_loss(nn.Linear(8, 13), hidden, labels, chunk_rows=4)


def _gpt_pair(**kw):
    torch.manual_seed(0)
    plain = gpt.build("tiny", vocab_size=97, seq_len=32, **kw)
    return plain


def _run(model, ids, labels, **kw):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=labels, **kw)
    out.loss.backward()
    return out, out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gpt_loss_chunk_equals_unchunked(checkpointing):
    model = _gpt_pair(activation_checkpointing=checkpointing)
    ids = torch.randint(0, 97, (2, 32))
    labels = torch.randint(0, 97, (2, 32))
    labels[0, :10] = -100
    pos = torch.cat([torch.arange(12), torch.arange(20)])[None].repeat(2, 1)
    kw = dict(position_ids=pos, num_items_in_batch=torch.tensor(17.0))
    _, loss, grads = _run(model, ids, labels, **kw)
    chunked = gpt.GPT(model.config.__class__(**{**vars(model.config), "loss_chunk": 5}))
    chunked.load_state_dict(model.state_dict())
    out, loss_c, grads_c = _run(chunked, ids, labels, **kw)
    assert out.logits is None
    torch.testing.assert_close(loss_c, loss, rtol=1e-6, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(grads_c[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_flex_block_mask_equals_sdpa_document_mask_forward():
    # flex has no CPU backward: on the CPU its forward checks the BlockMask built from the document ids
    torch.manual_seed(0)
    pos = torch.stack(
        [
            torch.cat([torch.arange(5), torch.arange(150)]),
            torch.cat([torch.arange(70)] * 2 + [torch.arange(15)]),
        ]
    )
    q, k, v = (torch.randn(2, 3, 155, 8) for _ in range(3))
    with torch.no_grad():
        got = flex_document_attention(q, k, v, DocumentBlockMask.from_position_ids(pos))
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=gpt.document_causal_mask(pos))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gpt_keeps_the_sdpa_mask_where_flex_cannot_train():
    assert not flex_available(torch.device("cpu"))
    model = _gpt_pair(attention="flex")
    pos = torch.cat([torch.arange(12), torch.arange(20)])[None]
    model(
        torch.randint(0, 97, (1, 32)), labels=torch.randint(0, 97, (1, 32)), position_ids=pos
    ).loss.backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention trains on CUDA only")
def test_gpt_flex_document_mask_equals_sdpa_mask_cuda():
    model = _gpt_pair().cuda()
    flex = gpt.GPT(model.config.__class__(**{**vars(model.config), "attention": "flex"})).cuda()
    flex.load_state_dict(model.state_dict())
    ids = torch.randint(0, 97, (2, 32), device="cuda")
    labels = torch.randint(0, 97, (2, 32), device="cuda")
    pos = torch.stack(
        [torch.cat([torch.arange(5), torch.arange(27)]), torch.cat([torch.arange(16)] * 2)]
    ).cuda()
    want, loss, grads = _run(model, ids, labels, position_ids=pos)
    got, loss_f, grads_f = _run(flex, ids, labels, position_ids=pos)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    for name, g in grads.items():
        torch.testing.assert_close(grads_f[name], g, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("kwargs", "words"), [({"loss_chunk": -1}, "loss_chunk"), ({"attention": "flash"}, "sdpa or flex")]
)
def test_bad_options_are_clear_errors(kwargs, words):
    with pytest.raises(ValueError, match=words):
        gpt.build("tiny", vocab_size=97, seq_len=16, **kwargs)


def _llama(**kw):
    from zerolaunch.models.hf import build

    torch.manual_seed(0)
    config = dict(
        model_type="llama", vocab_size=53, hidden_size=16, intermediate_size=24, num_hidden_layers=2
    )
    config.update(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return build(config=config, **kw)


@pytest.mark.parametrize("items", [None, 7.0])
def test_hf_loss_chunk_equals_hf_loss(items):
    plain, chunked = _llama(), _llama(loss_chunk=4)
    ids = torch.randint(0, 53, (2, 10))
    labels = ids.clone()
    labels[0, :4] = -100
    kw = {} if items is None else {"num_items_in_batch": torch.tensor(items)}
    got, want = chunked(input_ids=ids, labels=labels, **kw), plain(input_ids=ids, labels=labels, **kw)
    assert got.logits is None
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-6, atol=1e-6)
    got.loss.backward()
    want.loss.backward()
    for (name, p), q in zip(chunked.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    # without labels the model's own forward gives the logits
    torch.testing.assert_close(chunked(input_ids=ids).logits, plain(input_ids=ids).logits)
    # in eval mode the model's own forward runs (evaluation metrics and predict() read the logits)
    chunked.eval(), plain.eval()
    got, want = chunked(input_ids=ids, labels=labels, **kw), plain(input_ids=ids, labels=labels, **kw)
    torch.testing.assert_close(got.logits, want.logits)
    torch.testing.assert_close(got.loss, want.loss)


def test_hf_loss_chunk_bad_value_is_a_clear_error():
    with pytest.raises(ValueError, match="loss_chunk must be an int >= 0"):
        _llama(loss_chunk="big")


def test_gpt_loss_chunk_under_a_whole_forward_compile():
    # train.compile_scope: model traces the head's loss with dynamo (aot_eager: no C++ compiler needed)
    model, ref = _gpt_pair(loss_chunk=8), _gpt_pair()
    ids = torch.randint(0, 97, (2, 32))
    compiled = torch.compile(model, backend="aot_eager")
    loss = compiled(ids, labels=ids).loss
    loss.backward()
    want = ref(ids, labels=ids).loss
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
