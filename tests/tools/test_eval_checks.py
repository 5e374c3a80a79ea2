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


def test_a_single_token_out_of_range_is_refused_and_a_device_tensor_is_not_read():
    """The range check reads every CPU tensor, down to one token; a tensor elsewhere is left to the caller."""
    with pytest.raises(ValueError, match=r"x must hold ids in \[0, 4\), got range \[4, 4\]"):
        check_tokens("x", torch.tensor([[4]]), 4)
    elsewhere = torch.full((1, 2), 9, dtype=torch.long, device="meta")
    assert check_tokens("x", elsewhere, 4) is elsewhere


def test_default_row_ids_count_the_batch_on_the_given_device():
    """Without row ids, the sequences are keyed 0..B-1 on the device they are used on."""
    ids = check_row_ids(None, 3, torch.device("meta"))
    assert ids.device.type == "meta" and ids.dtype == torch.long and tuple(ids.shape) == (3,)
    assert check_row_ids(None, 3, torch.device("cpu")).tolist() == [0, 1, 2]
