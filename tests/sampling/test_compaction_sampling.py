"""Early-stop compaction in the fused samplers.

Rows that stop (DDPD option A: every p(z = N) < eps; mask tau-leaping with eta = 0:
no mask left) leave the batch at the stop checks, every sync_every steps, through
ddpd.ops.compact_fixed / scatter_back. Checked here: a compacted run returns the
same samples, in the original order, as an uncompacted one and as the reference
under the same seed (per-row Philox streams); later passes of both models run on the
rows still running only, with row-evaluation counts that follow exactly from the
stop steps and the check schedule; the counts of evaluations saved.
"""
import pytest
import torch

from ddpd.sampling import PhiloxNoise, batch as sampling_batch, ddpd_sample, tau_leaping_mask
from ddpd.sampling.options import DDPDOptions, Execution, Guidance
from oracles.fixtures import single_thread  # noqa: F401  (autouse)
from oracles.toy import ToyProblem, dirichlet_p_data

TOY = ToyProblem(dirichlet_p_data(3, 5, seed=7), 3, 5)
M = TOY.models()
STEPS = 16
EPS = 0.3

RUNS = {
    "ddpd uniform": lambda batch, **kw: ddpd_sample(M.planner, M.uniform_denoiser, batch, 5, 3, steps=STEPS,
                                                    ddpd=DDPDOptions(eps=EPS), **kw),
    "ddpd mask k=2 x3": lambda batch, **kw: ddpd_sample(M.planner, M.mask_denoiser, batch, 5, 3, steps=STEPS,
                                                        ddpd=DDPDOptions(eps=EPS, k=2, parallel_steps=3),
                                                        denoiser_type="mask", **kw),
    "ddpd softmax": lambda batch, **kw: ddpd_sample(M.planner, M.uniform_denoiser, batch, 5, 3, steps=STEPS,
                                                    ddpd=DDPDOptions(selection="softmax", eps=EPS), **kw),
    "tau mask eta 0": lambda batch, **kw: tau_leaping_mask(M.mask_denoiser, batch, 5, 3, steps=STEPS, **kw),
}


@pytest.mark.parametrize("sync_every", [1, 4])
@pytest.mark.parametrize("name", RUNS)
def test_compacted_run_equals_uncompacted_and_reference(name, sync_every):
    run = RUNS[name]
    reference = run(400, seed=21)
    compacted = run(400, seed=21, execution=Execution(fused=True, sync_every=sync_every))
    uncompacted = run(400, seed=21, execution=Execution(fused=True, sync_every=sync_every, compaction=False))
    stops = reference.stop_step
    assert (stops < STEPS).float().mean() > 0.2 and (stops == STEPS).any()  # rows stop at many different steps
    for result in (compacted, uncompacted):
        assert torch.equal(result.tokens, reference.tokens)
        assert torch.equal(result.stop_step, reference.stop_step)
        assert result.steps == reference.steps
    # Uncompacted: the whole batch at every call; compacted: fewer, the difference is what it saved.
    assert uncompacted.planner_calls == compacted.planner_calls
    assert uncompacted.planner_rows == 400 * uncompacted.planner_calls and uncompacted.planner_rows_saved == 0
    assert uncompacted.denoiser_rows == 400 * uncompacted.denoiser_calls and uncompacted.denoiser_rows_saved == 0
    assert compacted.denoiser_rows + compacted.denoiser_rows_saved == uncompacted.denoiser_rows
    assert compacted.planner_rows + compacted.planner_rows_saved == uncompacted.planner_rows
    assert compacted.denoiser_rows_saved > 0
    if sync_every == 1 and name.startswith("ddpd"):  # leaving at once, as the reference rows do
        assert (compacted.planner_rows, compacted.denoiser_rows) == (reference.planner_rows, reference.denoiser_rows)
    if name.startswith("tau"):  # the reference skips the rows without an unmasking in a step (a host sync)
        assert compacted.denoiser_rows >= reference.denoiser_rows


@pytest.mark.parametrize("sync_every", [1, 3, 5])
def test_row_evaluations_follow_the_stop_steps_and_the_check_schedule(sync_every):
    """A row that stops at step j stays until the first check c >= j (steps c with (c + 1) % sync_every == 0):
    the planner sees it at steps 0..c, the denoiser at 0..c-1 (it leaves before the denoiser's pass)."""
    result = RUNS["ddpd uniform"](300, seed=3, execution=Execution(fused=True, sync_every=sync_every))
    planner = denoiser = 0
    for j in result.stop_step.tolist():
        c = j + (-(j + 1)) % sync_every  # the first check at or after j
        if j < STEPS and c < result.planner_calls:
            planner, denoiser = planner + c + 1, denoiser + c
        else:
            planner, denoiser = planner + result.planner_calls, denoiser + result.denoiser_calls
    assert (result.planner_rows, result.denoiser_rows) == (planner, denoiser)


def test_later_passes_see_only_the_running_rows():
    seen = {"planner": [], "denoiser": []}

    def planner(x):
        seen["planner"].append(x.shape[0])
        return M.planner(x)

    def denoiser(x, t):
        seen["denoiser"].append(x.shape[0])
        return M.uniform_denoiser(x, t)

    result = ddpd_sample(planner, denoiser, 300, 5, 3, steps=STEPS, ddpd=DDPDOptions(eps=EPS), seed=8,
                         execution=Execution(fused=True, sync_every=1))
    stops = result.stop_step
    assert seen["planner"] == [int((stops >= i).sum()) for i in range(result.planner_calls)]
    assert seen["denoiser"] == [int((stops > i).sum()) for i in range(result.denoiser_calls)]
    assert seen["planner"][-1] < 300


def test_samples_come_back_in_the_original_order():
    """Row i keeps Philox row i (plus first_row) through every compaction: a slice of a
    batch run on its own, offset by first_row, gives the same rows."""
    whole = RUNS["ddpd mask k=2 x3"](60, noise=PhiloxNoise(5), execution=Execution(fused=True, sync_every=2))
    part = RUNS["ddpd mask k=2 x3"](25, noise=PhiloxNoise(5, first_row=30),
                                    execution=Execution(fused=True, sync_every=3))
    assert torch.equal(whole.tokens[30:55], part.tokens)
    assert torch.equal(whole.stop_step[30:55], part.stop_step)
    assert not torch.equal(whole.tokens[:25], part.tokens)


def test_compaction_goes_through_the_ops(monkeypatch):
    calls = {"compact_fixed": 0, "scatter_back": 0}
    for name in calls:
        original = getattr(sampling_batch, name)

        def counted(*args, _name=name, _original=original):
            calls[_name] += 1
            return _original(*args)

        monkeypatch.setattr(sampling_batch, name, counted)
    RUNS["ddpd uniform"](200, seed=1, execution=Execution(fused=True, sync_every=2))
    assert calls["compact_fixed"] > 0 and calls["scatter_back"] == calls["compact_fixed"] + 1
    calls.update(compact_fixed=0, scatter_back=0)
    RUNS["ddpd uniform"](200, seed=1, execution=Execution(fused=True, sync_every=2, compaction=False))
    assert calls == {"compact_fixed": 0, "scatter_back": 1}  # only the final write-back


def test_the_loop_ends_at_the_check_after_the_last_row_stops():
    clean = lambda x: torch.full(x.shape, -20.0)  # noqa: E731
    never = lambda x, t: pytest.fail("the denoiser must not run on rows that stopped at step 0")  # noqa: E731
    result = ddpd_sample(clean, never, 6, 5, 3, steps=10, seed=0, execution=Execution(fused=True, sync_every=1))
    assert result.steps == 0 and (result.stop_step == 0).all() and result.planner_calls == 1
    late = ddpd_sample(clean, M.uniform_denoiser, 6, 5, 3, steps=10, seed=0,
                       execution=Execution(fused=True, sync_every=4))
    # Stopped at step 0, frozen until the check at step 3: same tokens, stop_step and steps as before.
    assert late.planner_calls == 4 and late.denoiser_calls == 3 and late.steps == 0
    assert torch.equal(late.tokens, result.tokens) and (late.stop_step == 0).all()
    assert late.planner_rows_saved == 0 and late.denoiser_rows == 18


def test_reference_reports_rows_saved():
    result = RUNS["ddpd uniform"](300, seed=3)
    assert result.planner_rows_saved == 300 * result.planner_calls - result.planner_rows > 0
    assert result.denoiser_rows_saved == 300 * result.denoiser_calls - result.denoiser_rows > 0


@pytest.mark.parametrize("fused", [False, True])
def test_rows_left_out_of_a_pass_are_not_saved_by_early_stopping(fused):
    """The reference run leaves out of a denoiser pass the rows that draw nothing (no jump in
    a tau-leaping step); they had not stopped, so early stopping saved nothing: the count
    used to be every row-evaluation not run."""
    result = tau_leaping_mask(M.mask_denoiser, 300, 5, 3, steps=40, eta=5.0, seed=2, execution=Execution(fused=fused))
    assert (result.stop_step == 40).all()
    assert result.planner_rows_saved == result.denoiser_rows_saved == 0
    if not fused:
        assert result.denoiser_rows < 300 * result.denoiser_calls


class _Labelled:
    """The toy's denoiser taking labels (which it ignores), with or without a null label."""

    def __init__(self, null_label):
        self.null_label = null_label

    def __call__(self, x, t, labels=None):
        return M.uniform_denoiser(x, t)


@pytest.mark.parametrize("null_label", [3, None], ids=["null-label", "callable"])
@pytest.mark.parametrize("fused", [False, True])
def test_a_guided_run_saves_two_row_evaluations_a_row_that_left(null_label, fused):
    """A guided step evaluates the denoiser twice a row: a row that left the batch saves both
    (the count used to save one), so that run and saved add up to the uncompacted run's."""
    def run(execution):
        return ddpd_sample(M.planner, _Labelled(null_label), 100, 5, 3, steps=STEPS, ddpd=DDPDOptions(eps=EPS),
                           guidance=Guidance(torch.zeros(100, dtype=torch.long), scale=2.0), seed=4,
                           execution=execution)

    uncompacted = run(Execution(fused=True, compaction=False))
    result = run(Execution(fused=fused, sync_every=1))
    assert result.denoiser_rows_saved > 0
    assert result.denoiser_rows + result.denoiser_rows_saved == uncompacted.denoiser_rows == 2 * 100 * STEPS
    assert result.planner_rows + result.planner_rows_saved == uncompacted.planner_rows


@pytest.mark.parametrize("compaction", [True, False])
@pytest.mark.parametrize("name", ["ddpd uniform", "tau mask eta 0"])
def test_per_row_passes_and_commits_of_a_fused_run_are_the_reference_runs(name, compaction):
    """A stopped row stays in the fused batch until the next stop check, but its per-row passes
    and commits are those of the reference run, where it leaves the step it stops (and, in
    tau-leaping, the denoiser runs on the rows with an unmasking only)."""
    reference = RUNS[name](200, seed=5)
    fused = RUNS[name](200, seed=5, execution=Execution(fused=True, sync_every=4, compaction=compaction))
    assert ((reference.stop_step + 1) % 4 != 0).any()  # rows that stop between checks
    assert torch.equal(fused.planner_passes, reference.planner_passes)
    assert torch.equal(fused.denoiser_passes, reference.denoiser_passes)
    assert torch.equal(fused.commits, reference.commits)


@pytest.mark.parametrize("fused", [False, True])
def test_steps_is_the_stop_step_of_the_last_row_to_stop(fused):
    # row 0 is fully prompted and stops at once; SampleResult.steps is the latest stop, not row 0's
    from ddpd.sampling import Prompt

    x_init = torch.randint(0, 3, (3, 5), generator=torch.Generator().manual_seed(0))
    x_init[1:, 2:] = -1
    x_init[2, 1] = -1
    result = tau_leaping_mask(M.mask_denoiser, 3, 5, 3, steps=STEPS, seed=1, prompt=Prompt(x_init),
                              execution=Execution(fused=fused))
    assert int(result.stop_step[0]) == 0 and result.steps == int(result.stop_step.max()) > 0


def test_buckets_are_the_next_power_of_two():
    # a bucketed batch (CUDA graphs) keeps this many rows: its rows saved are counted from it
    assert [sampling_batch._bucket(n) for n in (0, 1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 4, 4, 8, 8, 16]


def test_a_stop_check_where_no_row_stopped_keeps_the_batch():
    """A check with every row still running packs nothing: the batch, and a graph captured on it, stay."""
    batch = sampling_batch.FusedBatch(torch.zeros(4, 3, dtype=torch.long))
    x = batch.x
    batch.finish(torch.zeros(4, dtype=torch.bool), 0)
    assert batch.generation == 0 and batch.x is x


def test_a_row_stopped_before_a_check_keeps_its_first_stop_step():
    """FusedBatch.finish records a row's stop once: a later `done` for it (the row stays frozen
    in the batch until the check) leaves its stop step; rows never done stop at the budget."""
    batch = sampling_batch.FusedBatch(torch.zeros(4, 3, dtype=torch.long), sync_every=3)
    batch.finish(torch.tensor([True, False, False, False]), 0, check=False)
    batch.finish(torch.tensor([True, True, False, False]), 5, check=False)
    assert batch.running().tolist() == [False, False, True, True]
    # a row stopped at step 0 is stopped too: the budget does not overwrite it
    assert batch.result(9).stop_step.tolist() == [0, 5, 9, 9]


def test_rows_leave_a_compacted_batch_with_their_ids_state_and_tokens():
    """At a stop check the running rows are packed in order with their row ids, state and the
    carried tensors; the rows that left are written to their place in the output."""
    x = torch.arange(12).view(4, 3)
    batch = sampling_batch.FusedBatch(x.clone(), state=dict(tag=torch.tensor([10, 11, 12, 13])))
    carried = torch.tensor([0.0, 1.0, 2.0, 3.0])
    kept, = batch.finish(torch.tensor([False, True, False, True]), 1, carried)
    assert batch.rows.tolist() == [0, 2] and batch.state["tag"].tolist() == [10, 12]
    assert kept.tolist() == [0.0, 2.0] and batch.x.tolist() == [x[0].tolist(), x[2].tolist()]
    assert batch.generation == 1 and batch.running_rows == 2 and not batch.finished
    batch.x += 100
    result = batch.result(4)
    assert result.tokens.tolist() == [(x[0] + 100).tolist(), x[1].tolist(), (x[2] + 100).tolist(), x[3].tolist()]
    assert result.stop_step.tolist() == [4, 1, 4, 1] and result.steps == 4


def test_an_uncompacted_batch_keeps_its_rows_at_a_check_and_counts_the_running_ones():
    batch = sampling_batch.FusedBatch(torch.zeros(3, 2, dtype=torch.long), compaction=False)
    x = batch.x
    batch.finish(torch.tensor([True, True, True]), 0)
    assert batch.x is x and batch.generation == 0 and batch.running_rows == 0 and batch.finished


@pytest.mark.parametrize("sync_every,checks", [(1, [0, 1, 2, 3, 4, 5]), (3, [2, 5])])
def test_stop_checks_fall_on_every_sync_every_th_step(sync_every, checks):
    batch = sampling_batch.FusedBatch(torch.zeros(1, 2, dtype=torch.long), sync_every=sync_every)
    assert [step for step in range(6) if batch.check_due(step)] == checks


def test_the_reference_batch_removes_a_row_the_step_it_stops():
    """RunningBatch.finish writes the stopped rows out at their stop step and keeps the others
    (ids, sequences, state and carried tensors); no stop returns the carried tensors as given."""
    x = torch.arange(8).view(4, 2)
    batch = sampling_batch.RunningBatch(x.clone(), state=dict(tag=torch.tensor([5, 6, 7, 8])))
    carried = torch.tensor([1, 2, 3, 4])
    assert batch.finish(torch.zeros(4, dtype=torch.bool), 0, carried, None)[0] is carried
    kept, none = batch.finish(torch.tensor([False, True, True, False]), 3, carried, None)
    assert none is None and kept.tolist() == [1, 4] and batch.rows.tolist() == [0, 3]
    assert batch.state["tag"].tolist() == [5, 8] and len(batch) == 2 and not batch.finished
    batch.x = batch.x + 50
    result = batch.result(7)
    assert result.tokens.tolist() == [[50, 51], [2, 3], [4, 5], [56, 57]]
    assert result.stop_step.tolist() == [7, 3, 3, 7] and result.steps == 7 and batch.finished


def test_passes_and_commits_count_only_the_running_rows_a_step_uses():
    """Per row: a planner pass counts for every running row, a denoiser pass for the rows it
    uses, commits for the running rows; a row that stopped before the check counts nothing."""
    batch = sampling_batch.FusedBatch(torch.zeros(3, 2, dtype=torch.long), sync_every=10)
    batch.finish(torch.tensor([False, True, False]), 0, check=False)
    logits = lambda x, *args: torch.zeros(*x.shape, 4)  # noqa: E731
    batch.planner(lambda x: torch.zeros(x.shape), batch.x)
    batch.denoiser(logits, batch.x, torch.zeros(3), 4, used=torch.tensor([True, True, False]))
    batch.count_commits(torch.tensor([2, 3, 1]))
    result = batch.result(1)
    assert result.planner_passes.tolist() == [1, 0, 1] and result.denoiser_passes.tolist() == [1, 0, 0]
    assert result.commits.tolist() == [2, 0, 1] and result.passes.tolist() == [2, 0, 1]
    assert result.tokens_per_pass == 3 / 3
    assert result.planner_rows == result.denoiser_rows == 3 and result.planner_rows_saved == 0


def test_a_pass_on_some_rows_counts_for_those_rows_only():
    batch = sampling_batch.RunningBatch(torch.zeros(4, 2, dtype=torch.long))
    rows = torch.tensor([1, 3])
    batch.denoiser(lambda x, t: torch.zeros(*x.shape, 3), batch.x[rows], torch.zeros(2), 3, rows=rows)
    assert batch.result(1).denoiser_passes.tolist() == [0, 1, 0, 1]


def test_rows_saved_are_the_rows_that_left_before_a_pass():
    batch = sampling_batch.RunningBatch(torch.zeros(5, 2, dtype=torch.long))
    batch.finish(torch.tensor([True, False, True, False, False]), 0)
    batch.planner(lambda x: torch.zeros(x.shape), batch.x)
    batch.denoiser(lambda x, t: torch.zeros(*x.shape, 3), batch.x, torch.zeros(3), 3)
    result = batch.result(1)
    assert (result.planner_rows, result.planner_rows_saved, result.planner_calls) == (3, 2, 1)
    assert (result.denoiser_rows, result.denoiser_rows_saved, result.denoiser_calls) == (3, 2, 1)


def test_tokens_per_pass_of_a_run_without_passes_is_zero():
    """A run whose rows all stopped before any pass has no commits and no passes: 0, not a
    division by zero."""
    none = torch.zeros(3, dtype=torch.long)
    result = sampling_batch.SampleResult(torch.zeros(3, 2, dtype=torch.long), 0, none, planner_passes=none,
                                         denoiser_passes=none, commits=none)
    assert result.tokens_per_pass == 0.0
    result.commits, result.denoiser_passes = torch.tensor([4, 2, 0]), torch.tensor([2, 1, 1])
    assert result.tokens_per_pass == 6 / 4


def test_a_padding_row_takes_the_last_rows_label():
    condition = sampling_batch.Condition(torch.tensor([7, 8, 9]), 2.0)
    assert condition.labels_of(torch.tensor([2, 0, 3, 1])).tolist() == [9, 7, 9, 8]
    assert condition.evaluations == 2
    assert sampling_batch.Condition(torch.tensor([7]), 0.0).evaluations == 1


def test_the_nan_warning_names_each_network_with_its_counts():
    assert sampling_batch.nan_warning(0, 5, 0, 7) == ""
    planner = sampling_batch.nan_warning(2, 5, 0, 7)
    assert planner.startswith("the planner returned NaN in 2 of 5 passes: ") and "denoiser" not in planner
    both = sampling_batch.nan_warning(1, 5, 3, 7)
    assert both.startswith("the planner returned NaN in 1 of 5 passes and the denoiser returned NaN or +inf "
                           "in 3 of 7 passes: NaN is read as -inf")
