"""ddpd.eval.checks: the token and row-id checks, and the checked model calls."""
import pytest
import torch

from ddpd.eval.checks import at, check_row_ids, check_tokens, log_probs, planner_logits


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


def test_tokens_of_another_integer_dtype_are_refused():
    """Int32 ids are not read as ids: the message names the argument, the dtype wanted and the one given."""
    with pytest.raises(TypeError, match=r"^x0 must have dtype torch.int64, got torch.int32$"):
        check_tokens("x0", torch.zeros(2, 3, dtype=torch.int32), 4)


@pytest.mark.parametrize("shape", [(0, 3), (2, 0)])
def test_tokens_with_no_sequence_or_no_position_are_refused_by_their_shape(shape):
    """An empty batch or an empty sequence is a ValueError naming the shape, not min()'s error on no elements."""
    with pytest.raises(ValueError, match=rf"x must have shape \[B, D\] with B, D >= 1, got \({shape[0]}, {shape[1]}\)"):
        check_tokens("x", torch.zeros(shape, dtype=torch.long), 4)


def test_a_negative_token_is_refused_and_no_vocab_size_leaves_the_range_unchecked():
    """The range's lower end is 0: -1 is refused; without a vocab size any id passes on the CPU too."""
    with pytest.raises(ValueError, match=r"x must hold ids in \[0, 4\), got range \[-1, 3\]"):
        check_tokens("x", torch.tensor([[3, -1]]), 4)
    far = torch.tensor([[-5, 10**6]])
    assert check_tokens("x", far, None) is far


def test_row_ids_of_another_length_dtype_or_sign_are_refused():
    """Row ids must be one Long id per sequence, none negative: each case names what was given."""
    with pytest.raises(ValueError, match=r"row_ids must be a Long tensor of shape \(3,\), got \(2,\)"):
        check_row_ids(torch.arange(2), 3, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"shape \(2,\), got \(2, 1\)"):
        check_row_ids(torch.zeros(2, 1, dtype=torch.long), 2, torch.device("cpu"))
    with pytest.raises(TypeError, match=r"row_ids must have dtype in \(torch.int64\), got torch.int32"):
        check_row_ids(torch.arange(2, dtype=torch.int32), 2, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"row_ids must be >= 0, got minimum -1"):
        check_row_ids(torch.tensor([0, -1]), 2, torch.device("cpu"))
    assert check_row_ids(torch.tensor([0, 5]), 2, torch.device("cpu")).tolist() == [0, 5]
    assert check_row_ids(torch.tensor([5]), 1, torch.device("cpu")).tolist() == [5]


def test_integer_logits_are_refused_and_a_time_free_planner_is_called_without_t():
    """Logits of the right shape but an integer dtype are an error naming the dtype; a planner given
    no times is called with the tokens alone."""
    x = torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match=r"model must return floating logits of shape \[1, 3, 3\], "
                                         r"got torch.int64 of shape \[1, 3, 3\]"):
        log_probs(lambda x: torch.zeros(1, 3, 3, dtype=torch.long), x, None, 3, "model")
    with pytest.raises(ValueError, match=r"planner must return floating logits of shape \[1, 3\]"):
        planner_logits(lambda x: torch.zeros(1, 3, dtype=torch.long), x, None)
    torch.testing.assert_close(planner_logits(lambda x: x.double(), x, None), torch.tensor([[0.0, 1.0, 2.0]]))


def test_logits_of_another_shape_are_refused_naming_both_shapes():
    """A model whose vocabulary or sequence differs from the tokens' is an error, not a broadcast."""
    x = torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match=r"denoiser must return floating logits of shape \[1, 3, 4\], "
                                         r"got torch.float32 of shape \[1, 3, 3\]"):
        log_probs(lambda x: torch.zeros(1, 3, 3), x, None, 4, "denoiser")
    with pytest.raises(ValueError, match=r"planner must return floating logits of shape \[1, 3\], "
                                         r"got torch.float32 of shape \[1, 2\]"):
        planner_logits(lambda x, t: torch.zeros(1, 2), x, torch.ones(1))


def test_at_reads_each_positions_value_at_its_own_index():
    """at(values, index)[b, d] is values[b, d, index[b, d]], per sequence and per position."""
    values = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    index = torch.tensor([[0, 3, 1], [2, 2, 0]])
    assert at(values, index).tolist() == [[0.0, 7.0, 9.0], [14.0, 18.0, 20.0]]


def test_tokens_or_logits_that_are_no_tensor_are_a_type_error_naming_the_type():
    """A list of ids, or a model returning a tuple, is refused by its type before any shape is read."""
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor of token ids, got list$"):
        check_tokens("x", [[0, 1]], 4)
    x = torch.tensor([[0, 1, 2]])
    with pytest.raises(TypeError, match=r"^model must return a tensor, got tuple$"):
        log_probs(lambda x: (torch.zeros(1, 3, 3),), x, None, 3, "model")
    with pytest.raises(TypeError, match=r"^planner must return a tensor, got list$"):
        planner_logits(lambda x: [0.0, 0.0, 0.0], x, None)
