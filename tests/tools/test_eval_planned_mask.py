"""The mask denoiser driven by the planner's mask (ddpd.eval.planned_mask): which mask each
position is scored under, and the denoiser passes that costs."""
import pytest
import torch

from ddpd.eval.planned_mask import masked_log_probs, planned_mask_log_probs
from ddpd.process import CustomSchedule, get_schedule

S = 3


def _reveals_mask(batches):
    """Token 0 where the position is masked, and the batch size of every call in `batches`."""
    def denoiser(x, t):
        batches.append(x.shape[0])
        logits = torch.zeros(*x.shape, S)
        logits[..., 0] = torch.where(x == S, 20.0, -20.0)
        return logits

    return denoiser


def _seen_masked(z_planned, extra, batches):
    x = torch.zeros(z_planned.shape, dtype=torch.long)
    log_q = planned_mask_log_probs(_reveals_mask(batches), x, z_planned, extra, S, get_schedule("linear"), S)
    return log_q.argmax(-1) == 0


def test_positions_outside_extra_keep_the_planned_mask_and_extra_ones_see_themselves_masked():
    z_planned = torch.tensor([[True, False, False, False], [False, False, False, False]])
    extra = torch.tensor([[False, True, False, False], [False, False, True, False]])
    assert torch.equal(_seen_masked(z_planned, extra, []), z_planned | extra)


def test_extra_positions_run_in_chunks_of_the_batch_size():
    """Three extra positions in a batch of two: one pass for the plan, then chunks of 2 and 1."""
    batches = []
    extra = torch.tensor([[True, True, False, False], [False, False, True, False]])
    _seen_masked(torch.zeros(2, 4, dtype=torch.bool), extra, batches)
    assert batches == [2, 2, 1]


def test_a_position_the_plan_already_masks_is_not_run_again():
    batches = []
    everything = torch.ones(2, 4, dtype=torch.bool)
    assert bool(_seen_masked(everything, everything, batches).all())
    assert batches == [2]


def test_the_denoiser_runs_at_float32_times_even_where_the_schedule_inverts_in_float64():
    """t = alpha^{-1}(1 - masked share) reaches the denoiser as float32 whatever dtype a custom
    schedule's inverse returns."""
    times = []

    def denoiser(x, t):
        times.append(t)
        return torch.zeros(*x.shape, S)

    schedule = CustomSchedule(lambda t: t, torch.ones_like, lambda a: torch.as_tensor(a, dtype=torch.float64))
    mask = torch.tensor([[True, False, False, False], [True, True, False, True]])
    masked_log_probs(denoiser, torch.zeros(2, 4, dtype=torch.long), mask, S, schedule, S)
    assert times[0].dtype == torch.float32
    assert times[0].tolist() == [0.75, 0.25]


def test_logits_of_the_wrong_shape_are_named_as_the_denoisers():
    with pytest.raises(ValueError, match=r"^denoiser must return floating logits of shape \[1, 4, 3\], "):
        masked_log_probs(lambda x, t: torch.zeros(*x.shape, S + 1), torch.zeros(1, 4, dtype=torch.long),
                         torch.ones(1, 4, dtype=torch.bool), S, get_schedule("linear"), S)


def test_each_position_sees_only_its_own_mask_added_to_the_plan():
    """The denoiser reveals how many positions of its row are masked: the plan's pass sees the
    plan alone, and each extra position's pass the plan and that position, not the other extras."""
    def counts_masked(x, t):
        return torch.nn.functional.one_hot((x == 5).sum(-1, keepdim=True).expand(x.shape), 5).float() * 20.0

    z_planned = torch.tensor([[True, False, False, False], [False, False, False, False]])
    extra = torch.tensor([[False, True, True, False], [True, False, False, True]])
    x = torch.zeros(2, 4, dtype=torch.long)
    log_q = planned_mask_log_probs(counts_masked, x, z_planned, extra, 5, get_schedule("linear"), 5)
    assert log_q.argmax(-1).tolist() == [[1, 2, 2, 1], [1, 0, 0, 1]]


def test_a_planned_position_outside_extra_costs_no_pass_of_its_own():
    batches = []
    z_planned = torch.tensor([[True, True, False, False], [False, True, False, True]])
    extra = torch.tensor([[True, False, False, False], [False, False, False, False]])
    assert torch.equal(_seen_masked(z_planned, extra, batches), z_planned)
    assert batches == [2]
