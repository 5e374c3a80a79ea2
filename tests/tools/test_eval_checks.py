"""ddpd.eval.checks: the token and row-id checks, and the checked model calls."""
import pytest
import torch

from ddpd.eval.checks import check_row_ids, check_tokens, log_probs, planner_logits


def test_tokens_of_three_dimensions_are_refused():
    """Token ids must be [B, D]: a trailing axis is an error naming the shape, not a longer row."""
    with pytest.raises(ValueError, match=r"x1 must have shape \[B, D\] with B, D >= 1, got \(2, 3, 1\)"):
        check_tokens("x1", torch.zeros(2, 3, 1, dtype=torch.long), 4)


def test_row_ids_are_moved_to_the_device_of_the_tokens():
    """Row ids given on the CPU key uniforms on the tokens' device."""
    assert check_row_ids(torch.arange(2), 2, torch.device("meta")).device.type == "meta"


def test_model_calls_return_float32_whatever_the_network_precision():
    """A bfloat16 network's logits are read in float32, and a time-free model is called without t."""
    x = torch.tensor([[0, 1, 2]])
    logits = torch.tensor([[[0.0, 1.0, 2.0]] * 3], dtype=torch.bfloat16)
    out = log_probs(lambda x: logits, x, None, 3, "model")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.log_softmax(logits.float(), -1))
    assert planner_logits(lambda x, t: logits[..., 0], x, torch.ones(1)).dtype == torch.float32
