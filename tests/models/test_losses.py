"""Objectives of ddpd.training.losses on tiny tensors whose values are worked out by hand."""
import math

import pytest
import torch

from ddpd.training.losses import ar_loss, denoiser_loss, planner_loss, uniform_model_loss

LN2, LN3, LN4_3 = math.log(2.0), math.log(3.0), math.log(4.0 / 3.0)


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-7)


# ---- planner -------------------------------------------------------------------------

def planner_case():
    # sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4
    logits = torch.tensor([[0.0, LN3], [-LN3, 0.0]], requires_grad=True)
    z_t = torch.tensor([[True, True], [False, False]])
    return logits, z_t


def test_planner_loss_by_hand():
    logits, z_t = planner_case()
    # -log 1/2, -log 3/4, -log(1 - 1/4), -log 1/2
    close(planner_loss(logits, z_t), (2 * LN2 + 2 * LN4_3) / 4)


def test_planner_loss_rate_weighted():
    logits, z_t = planner_case()
    per_sequence = LN2 + LN4_3  # both rows
    close(planner_loss(logits, z_t, rate=torch.tensor([2.0, 0.5])), (2.0 + 0.5) * per_sequence / 2)


def test_planner_loss_gradient_is_sigmoid_minus_target():
    logits, z_t = planner_case()
    planner_loss(logits, z_t).backward()
    expected = (torch.tensor([[0.5, 0.75], [0.25, 0.5]]) - z_t.float()) / 4
    torch.testing.assert_close(logits.grad, expected)


# ---- denoiser ------------------------------------------------------------------------

def denoiser_case():
    # V = 3. position 0: probs [1/4, 1/2, 1/4], target 1 -> ln 2, corrupted
    #        position 1: clean; its -inf logit at the target would give an infinite CE
    #        position 2: probs [1/2, 1/4, 1/4], target 2 -> ln 4, corrupted
    logits = torch.tensor([[[0.0, LN2, 0.0], [0.0, 0.0, -math.inf], [LN2, 0.0, 0.0]]], requires_grad=True)
    x1 = torch.tensor([[1, 2, 2]])
    z_t = torch.tensor([[True, False, True]])
    return logits, x1, z_t


def test_denoiser_loss_averages_corrupted_positions_only():
    logits, x1, z_t = denoiser_case()
    close(denoiser_loss(logits, x1, z_t), (LN2 + 2 * LN2) / 2)


def test_denoiser_loss_gradient():
    logits, x1, z_t = denoiser_case()
    denoiser_loss(logits, x1, z_t).backward()
    # (softmax - onehot) / number of corrupted positions; nothing at the clean position
    expected = torch.tensor([[[0.25, -0.5, 0.25], [0.0, 0.0, 0.0], [0.5, 0.25, -0.75]]]) / 2
    torch.testing.assert_close(logits.grad, expected)


def test_denoiser_loss_rate_weighted_is_per_sequence_sum():
    # batch of two: the case above (sum ln 2 + ln 4 = 3 ln 2) and a row with one
    # corrupted uniform position (ln 3)
    logits, x1, z_t = denoiser_case()
    logits = torch.cat([logits.detach(), torch.zeros(1, 3, 3)])
    x1 = torch.cat([x1, torch.tensor([[0, 0, 0]])])
    z_t = torch.cat([z_t, torch.tensor([[False, True, False]])])
    close(denoiser_loss(logits, x1, z_t, rate=torch.tensor([1.0, 4.0])), (3 * LN2 + 4.0 * LN3) / 2)
    close(denoiser_loss(logits, x1, z_t), (3 * LN2 + LN3) / 3)


def test_denoiser_loss_without_corrupted_positions_is_zero_not_nan():
    logits, x1, _ = denoiser_case()
    clean = torch.zeros(1, 3, dtype=torch.bool)
    loss = denoiser_loss(logits, x1, clean)
    close(loss, 0.0)
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))
    close(denoiser_loss(logits, x1, clean, rate=torch.tensor([3.0])), 0.0)


def test_a_sequence_without_corrupted_positions_adds_0_whatever_its_rate():
    """LinearSchedule.rate is inf at t = 1, where nothing is corrupted: inf * 0 made the whole
    batch's loss and gradient NaN; in the theorem such a sequence contributes 0."""
    from ddpd.process import LinearSchedule

    logits, x1, z_t = denoiser_case()
    logits = torch.cat([logits.detach(), torch.zeros(1, 3, 3)]).requires_grad_()
    x1, z_t = torch.cat([x1, x1]), torch.cat([z_t, torch.zeros_like(z_t)])
    rate = LinearSchedule().rate(torch.tensor([0.5, 1.0]))
    assert rate.tolist() == [2.0, math.inf]
    loss = denoiser_loss(logits, x1, z_t, rate=rate)
    close(loss, 2.0 * 3 * LN2 / 2)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and not logits.grad[1].any()


@pytest.mark.parametrize("bad", [-1.0, math.nan])
def test_a_negative_or_nan_rate_is_refused(bad):
    logits, x1, z_t = denoiser_case()
    for loss in (lambda rate: denoiser_loss(logits, x1, z_t, rate=rate),
                 lambda rate: planner_loss(logits[..., 0], z_t, rate=rate)):
        with pytest.raises(ValueError, match=r"rate: expected values >= 0 \(alpha_dot / \(1 - alpha\)\), got"):
            loss(torch.tensor([bad]))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_denoiser_loss_leaves_non_finite_logits_at_clean_positions_out_of_the_loss(bad):
    logits = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(0))
    x1 = torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1]])
    z_t = torch.tensor([[True, True, False, False], [False, True, False, True]])
    poisoned = logits.clone()
    poisoned[0, 2], poisoned[1, 0, 3] = bad, bad  # clean positions only
    for rate in (None, torch.tensor([1.0, 2.0])):
        assert torch.equal(denoiser_loss(poisoned, x1, z_t, rate=rate), denoiser_loss(logits, x1, z_t, rate=rate))


def test_losses_of_an_empty_batch_are_zero_not_nan():
    logits, x1 = torch.zeros(0, 3, 4), torch.zeros(0, 3, dtype=torch.long)
    z_t = torch.zeros(0, 3, dtype=torch.bool)
    for loss in (planner_loss(logits[..., 0], z_t), planner_loss(logits[..., 0], z_t, rate=torch.zeros(0)),
                 denoiser_loss(logits, x1, z_t), denoiser_loss(logits, x1, z_t, rate=torch.zeros(0)),
                 uniform_model_loss(logits, x1), ar_loss(logits, x1)):
        close(loss, 0.0)


def test_denoiser_loss_of_one_corrupted_position_is_its_cross_entropy():
    """The mean's count is clamped to 1 for an all-clean batch only: one corrupted position is
    divided by 1, its own -log 1/2."""
    logits, x1, _ = denoiser_case()
    close(denoiser_loss(logits, x1, torch.tensor([[True, False, False]])), LN2)


def test_a_rate_of_0_is_taken_and_a_negative_one_among_others_refused():
    """The cosine schedule's rate is 0 at t = 0 (alpha_dot = 0): such a sequence weighs 0. A
    negative rate is refused wherever it sits in the batch, not only as its largest."""
    from ddpd.process import CosineSchedule

    logits, z_t = planner_case()
    rate = CosineSchedule().rate(torch.tensor([0.0, 0.0]))
    assert rate.tolist() == [0.0, 0.0]
    close(planner_loss(logits, z_t, rate=rate), 0.0)
    d_logits, x1, d_z = denoiser_case()
    close(denoiser_loss(d_logits, x1, d_z, rate=rate[:1]), 0.0)
    with pytest.raises(ValueError, match=r"rate: expected values >= 0 .* got a minimum of -1.0"):
        planner_loss(logits, z_t, rate=torch.tensor([2.0, -1.0]))


def test_reduction_sum_is_the_means_numerator():
    """The trainer sums every loss over a step's micro-batches and processes and divides once by
    their count of terms: "sum" must be each mean's numerator, the rate-weighted one included."""
    logits, z_t = planner_case()
    close(planner_loss(logits, z_t, reduction="sum"), 2 * LN2 + 2 * LN4_3)
    close(planner_loss(logits, z_t, rate=torch.tensor([2.0, 0.5]), reduction="sum"), 2.5 * (LN2 + LN4_3))
    d_logits, x1, d_z = denoiser_case()
    close(denoiser_loss(d_logits, x1, d_z, reduction="sum"), 3 * LN2)
    close(denoiser_loss(d_logits, x1, d_z, rate=torch.tensor([4.0]), reduction="sum"), 12 * LN2)
    close(uniform_model_loss(torch.zeros(1, 3, 3), x1, reduction="sum"), 3 * LN3)
    close(ar_loss(torch.zeros(1, 3, 3), torch.tensor([[3, 1, 0]]), reduction="sum"), 2 * LN3)


def test_the_rate_weighted_mean_of_one_sequence_is_its_weighted_sum():
    """With rate the mean divides by the number of sequences: by 1 for a batch of one."""
    logits, z_t = planner_case()
    close(planner_loss(logits[:1], z_t[:1], rate=torch.tensor([2.0])), 2.0 * (LN2 + LN4_3))
    d_logits, x1, d_z = denoiser_case()
    close(denoiser_loss(d_logits, x1, d_z, rate=torch.tensor([4.0])), 4.0 * 3 * LN2)


def test_a_float64_rate_gives_a_float32_loss():
    """A rate in float64 (a schedule evaluated in double) weighs in float32, as the logits do."""
    logits, z_t = planner_case()
    d_logits, x1, d_z = denoiser_case()
    for loss, rate in ((lambda r: planner_loss(logits, z_t, rate=r), torch.tensor([2.0, 0.5])),
                       (lambda r: denoiser_loss(d_logits, x1, d_z, rate=r), torch.tensor([4.0]))):
        weighted = loss(rate.double())
        assert weighted.dtype == torch.float32
        torch.testing.assert_close(weighted, loss(rate))


def test_planner_loss_low_precision_logits_computed_in_float32():
    logits = torch.randn(2, 5, generator=torch.Generator().manual_seed(0)).bfloat16()
    z_t = torch.tensor([[True, False, True, True, False], [False, True, True, False, True]])
    loss = planner_loss(logits, z_t)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, planner_loss(logits.float(), z_t))


def test_denoiser_loss_low_precision_logits_computed_in_float32():
    logits = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0)).bfloat16()
    x1 = torch.tensor([[0, 1, 2, 3, 0], [3, 2, 1, 0, 3]])
    z_t = torch.tensor([[True, False, True, True, False], [False, True, True, False, True]])
    loss = denoiser_loss(logits, x1, z_t)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, denoiser_loss(logits.float(), x1, z_t))


# ---- single uniform model and AR -----------------------------------------------------

def test_uniform_model_loss_averages_all_positions():
    logits = torch.tensor([[[0.0, LN2, 0.0], [0.0, 0.0, 0.0], [LN2, 0.0, 0.0]]])
    x1 = torch.tensor([[1, 2, 2]])
    # ln 2, ln 3, ln 4
    close(uniform_model_loss(logits, x1), (LN2 + LN3 + 2 * LN2) / 3)


def test_ar_loss_shifts_targets():
    # position 0 predicts x[1] = 1 (probs [1/4, 1/2, 1/4] -> ln 2),
    # position 1 predicts x[2] = 0 (uniform -> ln 3), position 2 predicts nothing
    logits = torch.tensor([[[0.0, LN2, 0.0], [0.0, 0.0, 0.0], [math.inf, 0.0, 0.0]]])
    x = torch.tensor([[3, 1, 0]])  # x[0] = 3 is a BOS id outside the 3 output classes
    close(ar_loss(logits, x), (LN2 + LN3) / 2)


# ---- validation ----------------------------------------------------------------------

def test_validation_errors_name_the_argument():
    logits, x1, z_t = denoiser_case()
    with pytest.raises(TypeError, match="z_t"):
        denoiser_loss(logits, x1, z_t.long())
    with pytest.raises(ValueError, match="z_t"):
        denoiser_loss(logits, x1, z_t[:, :2])
    with pytest.raises(ValueError, match="x1"):
        denoiser_loss(logits, torch.tensor([[1, 3, 2]]), z_t)
    with pytest.raises(TypeError, match="x1"):
        denoiser_loss(logits, x1.float(), z_t)
    with pytest.raises(ValueError, match="rate"):
        denoiser_loss(logits, x1, z_t, rate=torch.ones(2))
    with pytest.raises(TypeError, match="logits"):
        planner_loss(torch.zeros(1, 3, dtype=torch.long), z_t)
    with pytest.raises(ValueError, match="logits"):
        planner_loss(torch.zeros(1, 3, 1), z_t)
    with pytest.raises(ValueError, match="x: expected at least 2 tokens per sequence, got 1"):
        ar_loss(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x\[:, 1:\]: expected ids"):
        ar_loss(torch.zeros(1, 2, 3), torch.tensor([[0, 3]]))


def test_every_loss_refuses_integer_logits_and_targets_of_another_dtype():
    """Integer logits (cast and taken by the float32 cross-entropy), a 0/1 z_t of another dtype
    and a float x are TypeErrors naming the argument, not its slice."""
    logits, x1, z_t = denoiser_case()
    ids = torch.zeros(1, 3, 3, dtype=torch.long)
    for loss in (lambda lg: denoiser_loss(lg, x1, z_t), lambda lg: uniform_model_loss(lg, x1),
                 lambda lg: ar_loss(lg, x1)):
        with pytest.raises(TypeError, match="logits: expected a floating-point tensor, got torch.int64"):
            loss(ids)
    with pytest.raises(TypeError, match="z_t: expected dtype torch.bool, got torch.int64"):
        planner_loss(logits[..., 0], z_t.long())
    with pytest.raises(TypeError, match="x: expected dtype torch.int64, got torch.float32"):
        ar_loss(logits, x1.float())


def test_validation_refuses_what_torch_would_take_without_a_word():
    """The checks torch does not make, or makes without naming the argument: an x1 id of
    -100 is cross_entropy's ignore_index (the position would silently leave the loss), an
    unknown reduction would return the mean, and a planner's z_t of another shape is torch's
    "Target size" error, which names neither."""
    logits, x1, z_t = denoiser_case()
    for loss in (lambda x: denoiser_loss(logits, x, z_t), lambda x: uniform_model_loss(logits, x)):
        with pytest.raises(ValueError, match=r"x1: expected ids in \[0, 3\)"):
            loss(torch.full_like(x1, -100))
    with pytest.raises(ValueError, match=r"x\[:, 1:\]: expected ids"):
        ar_loss(logits, torch.full_like(x1, -100))
    for loss in (lambda r: planner_loss(logits[..., 0], z_t, reduction=r),
                 lambda r: denoiser_loss(logits, x1, z_t, reduction=r),
                 lambda r: uniform_model_loss(logits, x1, reduction=r), lambda r: ar_loss(logits, x1, reduction=r)):
        with pytest.raises(ValueError, match="reduction must be one of"):
            loss("none")
    with pytest.raises(ValueError, match="z_t: expected shape"):
        planner_loss(logits[..., 0], z_t[:, :1])
    with pytest.raises(ValueError, match=r"x: expected shape \(1, 3\), got \(1, 4\)"):  # torch: "batch_size"
        ar_loss(logits, torch.zeros(1, 4, dtype=torch.long))
    for rate, match in (([1.0], "rate: expected a torch.Tensor, got list"),
                        (torch.ones(1, dtype=torch.long), "rate: expected a floating-point tensor")):
        with pytest.raises(TypeError, match=match):
            denoiser_loss(logits, x1, z_t, rate=rate)


def test_messages_give_the_expected_dimensions_and_the_ids_range():
    """A wrong number of dimensions names the expected one and the shape got; an id out of
    range, -1 (below cross_entropy's ignore_index) included, reports the range of the ids."""
    logits, x1, z_t = denoiser_case()
    with pytest.raises(ValueError, match=r"logits: expected 3 dimensions, got shape \(3, 3\)"):
        denoiser_loss(logits[0], x1, z_t)
    with pytest.raises(ValueError, match=r"z_t: expected 2 dimensions, got shape \(3,\)"):
        planner_loss(logits[..., 0], z_t[0])
    with pytest.raises(ValueError, match=r"rate: expected 1 dimensions, got shape \(1, 1\)"):
        denoiser_loss(logits, x1, z_t, rate=torch.ones(1, 1))
    for loss in (lambda x: denoiser_loss(logits, x, z_t), lambda x: uniform_model_loss(logits, x)):
        with pytest.raises(ValueError, match=r"x1: expected ids in \[0, 3\) \(the logits' last dim\), "
                                             r"got range \[-1, 2\]"):
            loss(torch.tensor([[0, -1, 2]]))
        with pytest.raises(ValueError, match=r"got range \[0, 5\]"):
            loss(torch.tensor([[0, 5, 2]]))


def test_a_non_finite_cross_entropy_at_a_corrupted_position_reaches_the_loss():
    """Only clean positions are left out: a -inf logit at a corrupted position's target gives an
    inf loss and a NaN logit there a NaN one, for the trainer to see, not a clamped number."""
    logits, x1, z_t = denoiser_case()
    logits = logits.detach().clone()
    logits[0, 0, 1] = -math.inf
    for rate in (None, torch.tensor([2.0])):
        assert denoiser_loss(logits, x1, z_t, rate=rate).item() == math.inf
    logits[0, 2] = math.nan
    for rate in (None, torch.tensor([2.0])):
        assert math.isnan(denoiser_loss(logits, x1, z_t, rate=rate).item())


def test_losses_of_fake_tensors_read_no_values():
    """Under FakeTensorMode (torch.compile's tracing, memory estimates) the value checks of the
    ids and the rate are skipped: reading a fake tensor's values raises."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        logits, x1 = torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long)
        z_t, rate = torch.ones(2, 3, dtype=torch.bool), torch.ones(2)
        losses = (planner_loss(logits[..., 0], z_t, rate=rate), denoiser_loss(logits, x1, z_t, rate=rate),
                  uniform_model_loss(logits, x1), ar_loss(logits, x1))
    assert all(loss.shape == () and loss.dtype == torch.float32 for loss in losses)


def test_uniform_model_and_ar_losses_of_a_batch_average_every_sequence():
    """Two sequences: the mean is over B * D positions for the uniform model and over B * (D - 1)
    predicted tokens for AR, each sequence's logits scored against its own tokens."""
    logits = torch.tensor([[[0.0, LN2, 0.0], [0.0, 0.0, 0.0], [LN2, 0.0, 0.0]],
                           [[0.0, 0.0, 0.0], [LN3, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    x1 = torch.tensor([[1, 2, 2], [0, 0, 1]])
    # ln 2, ln 3, ln 4 | ln 3, ln 5/3 (probs [3/5, 1/5, 1/5]), ln 3
    close(uniform_model_loss(logits, x1), (3 * LN2 + 3 * LN3 + math.log(5 / 3)) / 6)
    x = torch.tensor([[3, 1, 0], [3, 2, 1]])
    # row 0: ln 2, ln 3 | row 1: position 0 uniform -> ln 3, position 1 at x = 1 -> ln 5
    close(ar_loss(logits, x), (LN2 + 2 * LN3 + math.log(5.0)) / 4)
    close(ar_loss(logits, x, reduction="sum"), LN2 + 2 * LN3 + math.log(5.0))


def test_targets_of_another_shape_are_refused_by_name():
    """torch's cross_entropy would refuse an x1 of another batch size without naming it, and
    take one of more positions through the mask's broadcast."""
    logits, x1, z_t = denoiser_case()
    for x in (torch.zeros(2, 3, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long)):
        for loss in (lambda x: denoiser_loss(logits, x, z_t), lambda x: uniform_model_loss(logits, x)):
            with pytest.raises(ValueError, match=r"x1: expected shape \(1, 3\), got"):
                loss(x)


def test_confident_wrong_logits_give_their_exact_loss():
    """The losses work from logits (log-sum-exp), not from probabilities: a logit of 200 on the
    wrong side costs 200 nats, not a saturated log(0) clamped to 100 or inf."""
    close(planner_loss(torch.tensor([[200.0, -200.0]]), torch.tensor([[False, True]])), 200.0)
    logits = torch.tensor([[[200.0, 0.0, 0.0]]])
    x1, z_t = torch.tensor([[1]]), torch.tensor([[True]])
    close(denoiser_loss(logits, x1, z_t), 200.0)
    close(uniform_model_loss(logits, x1), 200.0)


def test_the_rate_weighted_losses_pass_a_gradient_to_the_rate():
    """The weighted mean is E_b[rate_b * sum_d term_bd], differentiable in the rate as in the
    logits: d loss / d rate_b is sequence b's summed term over the batch size."""
    logits, z_t = planner_case()
    rate = torch.tensor([2.0, 0.5], requires_grad=True)
    planner_loss(logits.detach(), z_t, rate=rate).backward()
    torch.testing.assert_close(rate.grad, torch.full((2,), (LN2 + LN4_3) / 2))
    d_logits, x1, d_z = denoiser_case()
    rate = torch.tensor([4.0], requires_grad=True)
    denoiser_loss(d_logits.detach(), x1, d_z, rate=rate).backward()
    torch.testing.assert_close(rate.grad, torch.tensor([3 * LN2]))


def test_an_inf_rate_of_a_sequence_with_corrupted_positions_is_not_dropped():
    """Only a sequence without a corrupted position is excused its rate: an inf rate where some
    position is corrupted makes the weighted loss inf, not a silent 0 for that sequence."""
    logits, x1, z_t = denoiser_case()
    logits = torch.cat([logits.detach(), torch.zeros(1, 3, 3)])
    x1, z_t = torch.cat([x1, x1]), torch.cat([z_t, z_t])
    assert denoiser_loss(logits, x1, z_t, rate=torch.tensor([1.0, math.inf])).item() == math.inf
    assert denoiser_loss(logits, x1, z_t, rate=torch.tensor([1.0, math.inf]), reduction="sum").item() == math.inf


def test_the_denoisers_unweighted_mean_reads_no_count_of_fake_tensors():
    """Without rate the denoiser's mean divides by the count of corrupted positions, a tensor
    clamped on the device: comparing it on the host (max(count, 1)) would read its value, a
    sync per step on CUDA and an error under FakeTensorMode. The fake test above passes a rate,
    whose count is the batch size."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        logits, x1 = torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long)
        z_t = torch.empty(2, 3).uniform_() < 0.5
        losses = [denoiser_loss(logits, x1, z_t, reduction=r) for r in ("mean", "sum")]
    assert all(loss.shape == () and loss.dtype == torch.float32 for loss in losses)


def test_a_batch_whose_every_rate_is_inf_is_taken():
    """Inf passes the rate check as the batch's least value too: a batch drawn wholly at t = 1
    (LinearSchedule's rate is inf there, nothing is corrupted) weighs 0, not a ValueError."""
    from ddpd.process import LinearSchedule

    logits, x1, _ = denoiser_case()
    logits = logits.detach().requires_grad_()
    rate = LinearSchedule().rate(torch.tensor([1.0]))
    assert rate.tolist() == [math.inf]
    loss = denoiser_loss(logits, x1, torch.zeros(1, 3, dtype=torch.bool), rate=rate)
    close(loss, 0.0)
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_ar_loss_refuses_one_token_sequences_in_an_empty_batch_too():
    """The length check reads the shape, not the values: an empty batch of one-token sequences
    is refused like a full one, not scored 0."""
    with pytest.raises(ValueError, match="x: expected at least 2 tokens per sequence, got 1"):
        ar_loss(torch.zeros(0, 1, 3), torch.zeros(0, 1, dtype=torch.long))


def test_every_loss_of_float64_logits_is_float32():
    """Losses are computed in float32 whatever the logits' precision, float64 included (a
    model run in double): the trainer sums and logs them as float32 scalars."""
    logits, z_t = planner_case()
    d_logits, x1, d_z = denoiser_case()
    d_logits = d_logits.detach().clone()
    d_logits[0, 1, 2] = 0.0
    cases = ((lambda lg: planner_loss(lg, z_t), logits.detach()),
             (lambda lg: denoiser_loss(lg, x1, d_z), d_logits),
             (lambda lg: uniform_model_loss(lg, x1), d_logits),
             (lambda lg: ar_loss(lg, x1), d_logits))
    for loss, lg in cases:
        double = loss(lg.double())
        assert double.dtype == torch.float32
        torch.testing.assert_close(double, loss(lg))


def test_uniform_model_and_ar_loss_gradients_are_softmax_minus_target():
    """Both losses train the logits: the gradient is (softmax - onehot(target)) over the count
    of terms, at every position for the uniform model and at all but the last one for AR."""
    logits = torch.tensor([[[0.0, LN2, 0.0], [0.0, 0.0, 0.0], [LN2, 0.0, 0.0]]], requires_grad=True)
    uniform_model_loss(logits, torch.tensor([[1, 2, 2]])).backward()
    expected = torch.tensor([[[0.25, -0.5, 0.25], [1 / 3, 1 / 3, -2 / 3], [0.5, 0.25, -0.75]]]) / 3
    torch.testing.assert_close(logits.grad, expected)
    logits.grad = None
    ar_loss(logits, torch.tensor([[3, 1, 0]])).backward()
    expected = torch.tensor([[[0.25, -0.5, 0.25], [-2 / 3, 1 / 3, 1 / 3], [0.0, 0.0, 0.0]]]) / 2
    torch.testing.assert_close(logits.grad, expected)


def test_an_id_out_of_range_in_a_later_sequence_is_refused():
    """The ids are checked over the whole batch, not its first sequence: an id of V or -100
    (cross_entropy's ignore_index) in the second sequence is refused by every loss."""
    logits, z_t = torch.zeros(2, 3, 3), torch.ones(2, 3, dtype=torch.bool)
    for bad in (3, -100):
        x = torch.tensor([[0, 1, 2], [2, bad, 0]])
        for loss in (lambda x: denoiser_loss(logits, x, z_t), lambda x: uniform_model_loss(logits, x)):
            with pytest.raises(ValueError, match=rf"x1: expected ids in \[0, 3\) .* got range \[{min(bad, 0)}, "):
                loss(x)
        with pytest.raises(ValueError, match=r"x\[:, 1:\]: expected ids in \[0, 3\)"):
            ar_loss(logits, x)


def test_the_planners_rate_weighs_each_sequence_by_its_own_rate():
    """planner_case's two rows sum to the same BCE, so a rate shared out over the batch would
    pass there: rows of different sums show each rate_b multiplies its own row's sum."""
    logits = torch.tensor([[0.0, 0.0], [LN3, -LN3]])
    z_t = torch.tensor([[True, False], [True, False]])
    # row 0: ln 2 + ln 2; row 1: -log 3/4 - log(1 - 1/4)
    close(planner_loss(logits, z_t, rate=torch.tensor([3.0, 1.0])), (3.0 * 2 * LN2 + 2 * LN4_3) / 2)
    close(planner_loss(logits, z_t, rate=torch.tensor([1.0, 3.0]), reduction="sum"), 2 * LN2 + 3.0 * 2 * LN4_3)
