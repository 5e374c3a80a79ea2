"""The seeded corruption of ddpd.eval.corruption on hand-picked uniforms: where the noise
falls, what fills it, and the forced position."""
import pytest
import torch

from ddpd.eval import corruption as C
from ddpd.eval.corruption import EvalNoise, forced_corruption, marginal_corruption
from ddpd.ops.rng import philox_uniform

X1 = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])
ALPHA = torch.tensor([0.5, 0.25])
U_VALUE = torch.full((2, 4), 0.6)


def test_a_uniform_equal_to_alpha_is_noise():
    """z^d = N iff u^d >= alpha, the boundary included, in both corruptions."""
    u_noise = torch.tensor([[0.5, 0.4, 0.6, 0.1], [0.25, 0.2, 0.9, 0.1]])
    expected = [[True, False, True, False], [True, False, True, False]]
    _, z = marginal_corruption(X1, ALPHA, u_noise, U_VALUE, "uniform", 5)
    assert z.tolist() == expected
    _, z, k = forced_corruption(X1, ALPHA, torch.tensor([0.0, 0.6]), u_noise, U_VALUE, "uniform", 5)
    assert z.tolist() == expected and k.tolist() == [2, 2]


def test_mask_noise_fills_with_vocab_size_unless_given_a_mask_id():
    """Noisy positions of mask noise hold V by default, or the mask_id passed; clean ones keep x1."""
    u_noise = torch.tensor([[0.9, 0.1, 0.9, 0.1], [0.1, 0.9, 0.1, 0.9]])
    x_t, _ = marginal_corruption(X1, ALPHA, u_noise, U_VALUE, "mask", 5)
    assert x_t.tolist() == [[5, 1, 5, 3], [3, 5, 1, 5]]
    x_t, _ = marginal_corruption(X1, ALPHA, u_noise, U_VALUE, "mask", 5, mask_id=7)
    assert x_t.tolist() == [[7, 1, 7, 3], [3, 7, 1, 7]]


def test_forced_position_of_the_top_uniform_is_the_last():
    """u_position = 1, which Philox's uniforms in (0, 1] can give, forces position D - 1."""
    x_t, z, k = forced_corruption(X1, ALPHA, torch.tensor([1.0, 0.0]), torch.zeros(2, 4), U_VALUE, "mask", 5)
    assert z.tolist() == [[False, False, False, True], [True, False, False, False]]
    assert x_t.tolist() == [[0, 1, 2, 5], [5, 2, 1, 0]] and k.tolist() == [1, 1]


def test_eval_noise_refuses_a_bad_seed_when_built():
    """The seed is checked when the noise is built, before any model runs."""
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64\), got -1"):
        EvalNoise(-1)


def test_named_streams_of_consecutive_samples_never_share_uniforms():
    """Every named stream lies below NUM_STREAMS, so sample m's last stream is not sample m + 1's first."""
    streams = (C.ALPHA, C.POSITION, C.NOISE, C.VALUE, C.PLANNED_MASK, C.CLEAN_TIME, C.FINAL_NOISE,
               C.FINAL_VALUE, C.FINAL_MASK)
    noise, rows = EvalNoise(3), torch.arange(4)
    draws = [noise.uniform(sample, stream, rows, 8) for sample in range(3) for stream in streams]
    assert len({tuple(u.flatten().tolist()) for u in draws}) == len(draws)


def test_uniform_noise_fills_with_floor_of_u_value_times_v():
    """A noisy position of uniform noise holds floor(u_value V) of its own uniform; clean ones keep x1."""
    u_noise = torch.tensor([[0.9, 0.1, 0.9, 0.1], [0.1, 0.9, 0.1, 0.9]])
    u_value = torch.tensor([[0.7, 0.9, 0.1, 0.7], [0.95, 0.2, 0.4, 0.45]])
    x_t, _ = marginal_corruption(X1, ALPHA, u_noise, u_value, "uniform", 5)
    assert x_t.tolist() == [[3, 1, 0, 3], [3, 1, 1, 2]]
    x_t, _, _ = forced_corruption(X1, ALPHA, torch.tensor([0.3, 0.0]), u_noise, u_value, "uniform", 5)
    assert x_t.tolist() == [[3, 4, 0, 3], [4, 1, 1, 2]]


def test_stratified_draw_is_the_sample_plus_its_uniform_over_the_samples():
    """stratified(m, M) = (m + u) / M with u the stream's own uniform, not 1 - u or another draw."""
    noise, rows = EvalNoise(5), torch.arange(6)
    u = noise.uniform(2, C.ALPHA, rows, 1)[:, 0]
    assert torch.equal(noise.stratified(2, 4, C.ALPHA, rows), (2 + u) / 4)


def test_eval_noise_draws_sample_m_stream_s_at_offset_m_num_streams_plus_s():
    """The documented layout of the offsets: the same seeded draws across versions of ddpd."""
    noise, rows = EvalNoise(7), torch.tensor([0, 5, 9])
    for sample, stream in ((0, C.VALUE), (3, C.NOISE), (2, C.FINAL_MASK)):
        expected = philox_uniform(7, sample * C.NUM_STREAMS + stream, rows, 6)
        assert torch.equal(noise.uniform(sample, stream, rows, 6), expected), (sample, stream)


def test_mask_noise_fills_with_a_mask_id_of_0():
    """mask_id = 0 is a mask id like any other, not a missing one."""
    u_noise = torch.tensor([[0.9, 0.1, 0.9, 0.1], [0.1, 0.9, 0.1, 0.9]])
    x_t, _ = marginal_corruption(X1 + 1, ALPHA, u_noise, U_VALUE, "mask", 5, mask_id=0)
    assert x_t.tolist() == [[0, 2, 0, 4], [4, 0, 2, 0]]


def test_eval_noise_gives_each_sample_sixteen_offsets():
    """NUM_STREAMS is part of the seeded layout: sample 1 starts at offset 16 and sample 2's
    FINAL_MASK lies at 40, so adding a stream leaves every estimate's draws where they were."""
    assert (C.ALPHA, C.POSITION, C.NOISE, C.VALUE, C.PLANNED_MASK, C.CLEAN_TIME, C.FINAL_NOISE, C.FINAL_VALUE,
            C.FINAL_MASK, C.NUM_STREAMS) == (0, 1, 2, 3, 4, 5, 6, 7, 8, 16)
    noise, rows = EvalNoise(7), torch.tensor([0, 3])
    assert torch.equal(noise.uniform(1, C.ALPHA, rows, 4), philox_uniform(7, 16, rows, 4))
    assert torch.equal(noise.uniform(2, C.FINAL_MASK, rows, 4), philox_uniform(7, 40, rows, 4))


def test_forced_corruption_counts_the_noisy_positions_as_int64():
    """k is Long[B] like the tokens, with the forced position counted once even where it is already noise."""
    u_noise = torch.tensor([[0.9, 0.1, 0.9, 0.1], [0.1, 0.1, 0.1, 0.1]])
    x_t, z, k = forced_corruption(X1, ALPHA, torch.tensor([0.0, 0.5]), u_noise, U_VALUE, "uniform", 5)
    assert k.dtype == torch.int64 and x_t.dtype == torch.int64 and z.dtype == torch.bool
    assert k.tolist() == [2, 1] and torch.equal(k, z.sum(-1))
