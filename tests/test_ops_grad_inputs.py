"""Sampling ops accept inputs that require grad (a live model's outputs or
parameters outside torch.no_grad()) and return non-differentiable draws."""
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
    tokens, valid = ops.sample_categorical(token_logits, seed=2)
    assert valid.all() and not tokens.requires_grad
    head = torch.nn.Linear(H, V)
    hidden = torch.randn(B, H, requires_grad=True)
    tokens_h, _ = ops.sample_from_hidden(hidden, head.weight, head.bias, seed=2)
    expected, _ = ops.sample_categorical(head(hidden), seed=2)
    assert torch.equal(tokens_h, expected)
    ops.multinomial(torch.rand(B, V, requires_grad=True), 2, seed=3)
