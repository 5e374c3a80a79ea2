"""Sampling ops accept inputs that require grad (a live model's outputs or
parameters outside torch.no_grad()) and return non-differentiable draws."""
import pytest
import torch

from ddpd import ops


def test_ops_accept_inputs_that_require_grad():
    B, D, V, H = 3, 9, 40, 8
    logits = torch.randn(B, D, requires_grad=True)
    x = torch.randint(0, V, (B, D))
    positions, sum_p, stop = ops.planner_select(logits, k=2, seed=1)
    assert positions.shape == (B, 2) and not sum_p.requires_grad
    ops.planner_mask(logits, x, positions, mask_id=V, seed=1)
    ops.planner_select_mask(logits, x, mask_id=V, k=1, seed=1)
    token_logits = torch.randn(B, V, requires_grad=True)
    tokens, valid, _, _ = ops.sample_categorical(token_logits, seed=2)
    assert valid.all() and not tokens.requires_grad
    head = torch.nn.Linear(H, V)
    hidden = torch.randn(B, H, requires_grad=True)
    tokens_h, _, _, _ = ops.sample_from_hidden(hidden, head.weight, head.bias, seed=2)
    expected, _, _, _ = ops.sample_categorical(head(hidden), seed=2)
    assert torch.equal(tokens_h, expected)
    ops.multinomial(torch.rand(B, V, requires_grad=True), 2, seed=3).tokens


def test_no_output_of_a_draw_requires_grad():
    """Tensors of sampling controls and noise may require grad too: the log-probabilities,
    confidences and stop statistics computed from them must not (no kernel has a
    backward; they used to carry a grad_fn that computed nothing)."""
    B, D, V, H = 3, 9, 40, 8
    t = torch.full((B,), 0.7, requires_grad=True)
    p = torch.full((B,), 0.9, requires_grad=True)
    m = torch.full((B,), 0.01, requires_grad=True)
    logits = torch.randn(B, V)
    for out in (ops.sample_categorical(logits, t, top_p=p, min_p=m, seed=1, return_logprob=True, confidence="margin"),
                ops.sample_from_hidden(torch.randn(B, H), torch.randn(V, H), None, t, top_p=p, min_p=m, seed=1,
                                       return_logprob=True, confidence="margin")):
        assert not any(x.requires_grad for x in out)
    noise = torch.rand(B, D).clamp_min(1e-6).requires_grad_()
    assert not ops.planner_select(torch.randn(B, D), 1, noise=noise)[1].requires_grad
    out = ops.planner_select_mask(torch.randn(B, D), torch.randint(0, V, (B, D)), V, noise=noise,
                                  mask_noise=torch.rand(B, D).requires_grad_())
    assert not any(x.requires_grad for x in out)


def test_compaction_is_seen_by_autograd():
    """compact_fixed differentiates like its reference, and scatter_back's in-place write
    is seen: a backward through a tensor it overwrote fails instead of giving a wrong
    gradient, and writes torch refuses (a leaf that requires grad) are refused."""
    a = torch.randn(4, 3, requires_grad=True)
    (packed,), index, count = ops.compact_fixed(torch.tensor([True, False, True, True]), 4, a)
    packed.sum().backward()
    assert torch.equal(a.grad, torch.tensor([1.0, 0.0, 1.0, 1.0])[:, None].expand(4, 3))
    b = a * 1.0
    loss = (b * b).sum()  # saves b
    ops.scatter_back(torch.tensor([0]), torch.zeros(1, 3), b)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with torch.no_grad():  # the fast path, which must still tell autograd of its write
        c = a * 1.0
    c.requires_grad_()
    loss = (c * c).sum()
    with torch.no_grad():
        ops.scatter_back(torch.tensor([0]), torch.zeros(1, 3), c)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        ops.scatter_back(torch.tensor([0]), torch.zeros(1, 3), torch.zeros(2, 3, requires_grad=True))
    with torch.inference_mode():
        frozen = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="[Ii]nplace update to inference tensor"):
        ops.scatter_back(torch.tensor([0]), torch.zeros(1, 3), frozen)


def test_scatter_back_reads_packed_rows_that_share_memory_with_out():
    x = torch.arange(8.0).reshape(4, 2)
    expected = ops.reference.scatter_back(torch.tensor([1, 0, 3, 2]), x.clone(), x.clone())
    assert torch.equal(ops.scatter_back(torch.tensor([1, 0, 3, 2]), x, x), expected)
    y = torch.arange(8.0).reshape(4, 2)
    expected = ops.reference.scatter_back(torch.tensor([2, 3]), y[:2].clone(), y.clone())
    assert torch.equal(ops.scatter_back(torch.tensor([2, 3]), y[:2], y), expected)


@pytest.mark.parametrize("bias", [False, True])
def test_a_live_heads_parameters_give_a_draw_without_grad(bias):
    """sample_from_hidden on an nn.Linear's own parameters outside torch.no_grad(): the
    log-probability and confidence carry no grad_fn, with or without the head's bias."""
    B, V, H = 3, 40, 8
    head = torch.nn.Linear(H, V, bias=bias)
    out = ops.sample_from_hidden(torch.randn(B, H), head.weight, head.bias, seed=1, return_logprob=True,
                                 confidence="entropy")
    assert not any(x.requires_grad for x in out)
    assert out.logprob.grad_fn is None and out.confidence.grad_fn is None
