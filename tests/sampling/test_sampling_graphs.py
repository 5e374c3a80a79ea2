"""CUDA graphs of the fused sampler steps (ddpd.sampling.graphs), checked on the CPU.

graphs="emulate" runs the capture and replay logic without CUDA: per batch generation and
key, one eager warm-up step, then one step function built at "capture" and called again for
every later step with the step tensor, so anything a step took from Python instead of its
tensors would be replayed stale. Those runs must draw exactly what eager fused runs draw, with
the same stop steps and forward-pass counts, for every clock and denoiser; and the emulation
must catch a step that bakes in a Python value. On a GPU the same runs replay real CUDA graphs
(tests/ops/test_op_gpu.py-style tests marked gpu).
"""
import contextlib

import pytest
import torch

from ddpd.sampling import (
    PhiloxNoise,
    TorchNoise,
    ddpd_sample,
    ddpd_sample_uniform,
    mask_sample,
    tau_leaping_mask,
    tau_leaping_planned,
    tau_leaping_uniform,
)
from ddpd.sampling.batch import RunningBatch
from ddpd.sampling.common import row
from ddpd.sampling.graphs import StepGraphs, step_graphs
from ddpd.sampling.options import DDPDOptions, Execution, Guidance, Prompt, Temperature, Truncation
from ddpd.sampling.policies import ConfidenceFactor, ConfidenceThreshold, EntropyBound, ErrorBudget, MaskGIT, ReMDM
from oracles.fixtures import single_thread, tiny_networks  # noqa: F401  (single_thread: autouse)


@pytest.fixture(scope="module")
def nets():
    return tiny_networks()


@pytest.fixture
def made_graphs(monkeypatch):
    """The StepGraphs the runs of a test make, in order."""
    graphs = []
    original = StepGraphs.__init__

    def recorded(self, *args, **kwargs):
        original(self, *args, **kwargs)
        graphs.append(self)

    monkeypatch.setattr(StepGraphs, "__init__", recorded)
    return graphs


CASES = {
    "planner clock, uniform, A": lambda n, v, **kw: ddpd_sample(n["planner"], n["uniform"], 48, 8, v, steps=24,
                                                                ddpd=DDPDOptions(eps=0.2), **kw),
    "planner clock, mask, A+C": lambda n, v, **kw: ddpd_sample(n["planner"], n["mask"], 48, 8, v, steps=24,
                                                               ddpd=DDPDOptions(selection="softmax", eps=0.2),
                                                               denoiser_type="mask", **kw),
    "planner clock, mask, B, k=3 x4": lambda n, v, **kw: ddpd_sample(
        n["planner"], n["mask"], 48, 8, v, steps=16, ddpd=DDPDOptions(stop="budget", k=3, parallel_steps=4),
        denoiser_type="mask", **kw),
    "exact clock, mask": lambda n, v, **kw: ddpd_sample(n["planner"], n["mask"], 48, 8, v, steps=40,
                                                        ddpd=DDPDOptions(clock="exact"), denoiser_type="mask", **kw),
    "single uniform model, A": lambda n, v, **kw: ddpd_sample_uniform(n["model"], 48, 8, v, steps=24,
                                                                      ddpd=DDPDOptions(eps=0.2), **kw),
    "planner clock, mask, error budget": lambda n, v, **kw: ddpd_sample(
        n["planner"], n["mask"], 48, 8, v, steps=12, denoiser_type="mask", ddpd=DDPDOptions(
            stop="budget", policy=ErrorBudget(1.0, 8, spread="cosine", known_noise=True, plan_every=3,
                                              choice_temperature=4.5, revise_above=0.5)), **kw),
}
# the mask loop: each policy's step reads the step index (the noise, MaskGIT's schedule and
# annealing, ReMDM's rates) from the step tensor when replayed
MASK_POLICIES = {"MaskGIT": MaskGIT(), "threshold": ConfidenceThreshold(0.3), "factor": ConfidenceFactor(2.0),
                 "entropy bound": EntropyBound(1.0), "ReMDM loop": ReMDM("loop", eta=0.1),
                 "ReMDM rescale": ReMDM("rescale", eta=0.5)}
for _name, _policy in MASK_POLICIES.items():
    CASES[f"mask loop, {_name}"] = lambda n, v, policy=_policy, **kw: mask_sample(n["mask"], 48, 8, v, steps=12,
                                                                                 policy=policy, **kw)
# tau-leaping: the grid's time and jump probability of the step, read from its tables
CASES.update({
    "tau-leaping mask": lambda n, v, **kw: tau_leaping_mask(n["mask"], 48, 8, v, steps=12, **kw),
    "tau-leaping mask, eta 0.5": lambda n, v, **kw: tau_leaping_mask(n["mask"], 48, 8, v, steps=12, eta=0.5, **kw),
    "tau-leaping uniform": lambda n, v, **kw: tau_leaping_uniform(n["model"], 48, 8, v, steps=12, **kw),
    "tau-leaping planned, mask": lambda n, v, **kw: tau_leaping_planned(n["planner"], n["mask"], 48, 8, v, steps=12,
                                                                       denoiser_type="mask", **kw),
})


@pytest.mark.parametrize("vocab", [27, 300])
@pytest.mark.parametrize("name", CASES)
def test_replayed_steps_draw_what_eager_steps_draw(nets, name, vocab, made_graphs):
    runs, graphs = {}, made_graphs
    with torch.inference_mode():
        for mode in ("off", "emulate"):
            runs[mode] = CASES[name](nets[vocab], vocab, noise=PhiloxNoise(4),
                                     execution=Execution(fused=True, sync_every=6, graphs=mode))
    eager, replayed = runs["off"], runs["emulate"]
    assert torch.equal(eager.tokens, replayed.tokens) and torch.equal(eager.stop_step, replayed.stop_step)
    assert (eager.planner_calls, eager.denoiser_calls) == (replayed.planner_calls, replayed.denoiser_calls)
    # finished rows stay in a power-of-two batch until the running ones fit half of it
    assert replayed.planner_rows >= eager.planner_rows and replayed.denoiser_rows >= eager.denoiser_rows
    assert len(graphs) == 1 and graphs[0].replays > graphs[0].captures > 0  # most steps were replays
    assert graphs[0].batch.generation <= 6  # 48 rows: at most 48 -> 32 -> 16 -> 8 -> 4 -> 2 -> 1


PROMPTED = {
    "MaskGIT": lambda n, **kw: mask_sample(n["mask"], 16, 8, 27, steps=10, policy=MaskGIT(), **kw),
    "ReMDM cap": lambda n, **kw: mask_sample(n["mask"], 16, 8, 27, steps=10, policy=ReMDM("cap", eta=0.2), **kw),
    "tau-leaping mask": lambda n, **kw: tau_leaping_mask(n["mask"], 16, 8, 27, steps=10, **kw),
    "tau-leaping mask, eta 0.5": lambda n, **kw: tau_leaping_mask(n["mask"], 16, 8, 27, steps=10, eta=0.5, **kw),
    "tau-leaping planned": lambda n, **kw: tau_leaping_planned(n["planner"], n["uniform"], 16, 8, 27, steps=10, **kw),
}


@pytest.mark.parametrize("name", PROMPTED)
def test_prompted_runs_replay_what_their_eager_steps_draw(nets, name, made_graphs):
    """Frozen and given-but-unfrozen prompt positions, rows the prompt fills whole, remasking."""
    graphs = made_graphs
    x_init = torch.full((16, 8), -1)
    x_init[:, :3] = 1
    x_init[:4] = 2  # four rows given whole
    frozen = x_init >= 0
    frozen[::2, :2] = False
    runs = {graphs: PROMPTED[name](nets[27], noise=PhiloxNoise(1), prompt=Prompt(x_init, frozen),
                                   execution=Execution(fused=True, sync_every=3, graphs=graphs))
            for graphs in ("off", "emulate")}
    assert torch.equal(runs["off"].tokens, runs["emulate"].tokens)
    assert torch.equal(runs["off"].stop_step, runs["emulate"].stop_step)
    assert torch.equal(runs["off"].denoiser_passes, runs["emulate"].denoiser_passes)
    assert torch.equal(runs["off"].commits, runs["emulate"].commits)
    assert len(graphs) == 1 and graphs[0].replays > graphs[0].captures > 0


def test_the_emulation_catches_a_step_that_bakes_in_a_python_value():
    batch = RunningBatch(torch.zeros(2, 3, dtype=torch.long))
    graphs = StepGraphs(batch, torch.device("cpu"), emulate=True)
    for i in range(5):  # the right step adds its own index, read from the step tensor when replayed
        graphs.run("right", lambda step: batch.x.add_(step), i)
    assert batch.x[0, 0] == sum(range(5))
    batch.x.zero_()
    for i in range(5):  # a step that adds the Python i it was built with: replays repeat i = 1
        graphs.run("baked", lambda step, i=i: batch.x.add_(i), i)
    assert batch.x[0, 0] == 0 + 1 + 1 + 1 + 1 != sum(range(5))


def test_the_emulation_catches_a_step_that_reads_its_step_tensor():
    """Indexing with the step tensor, int() or bool() of it read it back to the host: a CUDA
    graph cannot capture that, so the emulation refuses it (an eager step may: its i is an int)."""
    batch = RunningBatch(torch.zeros(2, 3, dtype=torch.long))
    table = torch.arange(10) * 10
    for read in (lambda step: table[step], lambda step: int(step), lambda step: bool(step)):
        graphs = StepGraphs(batch, torch.device("cpu"), emulate=True)
        graphs.run("read", lambda step: batch.x.add_(read(step)), 0)  # the warm-up step: eager, i an int
        with pytest.raises(RuntimeError, match="read its step tensor back to the host"):
            graphs.run("read", lambda step: batch.x.add_(read(step)), 1)
    for i in range(3):  # selected on the device instead (ddpd.sampling.common.row): replays read the right rows
        graphs.run("select", lambda step: batch.x.copy_(row(table, step).expand(2, 3)), i)
        assert batch.x[0, 0] == 10 * i


def test_the_emulation_catches_a_step_that_makes_a_tensor_of_numbers():
    """torch.as_tensor(3, device=...) in a step copies to the device: refused when replayed."""
    batch = RunningBatch(torch.zeros(2, 3, dtype=torch.long))
    graphs = StepGraphs(batch, torch.device("cpu"), emulate=True)
    graphs.run("make", lambda step: batch.x.add_(torch.as_tensor(3, device=batch.x.device)), 0)
    with pytest.raises(RuntimeError, match="made a tensor of Python numbers"):
        graphs.run("make", lambda step: batch.x.add_(torch.as_tensor(3, device=batch.x.device)), 1)


def test_with_graphs_the_batch_keeps_power_of_two_sizes(nets):
    sizes = []
    planner = nets[27]["planner"]
    recorded = lambda x: (sizes.append(x.shape[0]), planner(x))[1]  # noqa: E731
    result = ddpd_sample(recorded, nets[27]["uniform"], 48, 8, 27, steps=24, ddpd=DDPDOptions(eps=0.2), seed=4,
                         execution=Execution(fused=True, sync_every=2, graphs="emulate"))
    assert (result.stop_step < 24).sum() > 24  # more than half the rows stopped: the batch shrank
    assert sizes == sorted(sizes, reverse=True) and min(sizes) < 32
    assert all(n == 48 or n & (n - 1) == 0 for n in sizes)  # the first size, then powers of two


def test_graphs_stay_off_where_a_run_cannot_replay(nets):
    from ddpd.sampling.common import setup, start

    # CPU: auto captures nothing
    for execution in (Execution(fused=False), Execution(fused=True, graphs="off"), Execution(fused=True)):
        run, draws = setup("ddpd_sample", 4, 8, 27, steps=3, temperature=1.0, schedule="linear", seed=0, generator=None,
                           noise=None, device=None, prompt=None, guidance=None, truncation=Truncation(),
                           execution=execution)
        batch = start(run, draws)
        assert draws.graphs(batch, run) is None
        assert not getattr(batch, "buckets", False)  # an eager run lets finished rows leave at every stop check
    # the reference run has no fused steps to replay, even when told to emulate
    reference = Execution(fused=False, graphs="emulate")
    assert step_graphs(start(run, draws), run, reference, philox=True) is None
    assert step_graphs(start(run, draws), run, Execution(fused=True, graphs="emulate"), philox=True) is not None


def test_labelled_rows_keep_their_labels_when_the_batch_is_packed_into_a_bucket():
    """Packed into a power-of-two bucket, a batch's padding rows carry the row id B (one past
    the last): the labels of a class-conditional run are looked up for them too, which once
    indexed past the labels (a device-side assert on CUDA)."""
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(4, 3, generator=g)

    def planner(x):  # a row whose first token is 0 is clean at once, the others never
        return torch.where(x[:, :1] == 0, -20.0, 5.0).expand(x.shape)

    def denoiser(x, t, labels=None):
        return embed[x] + (0.0 if labels is None else labels[:, None, None].float())

    x_init = torch.full((8, 4), -1)
    x_init[:, 0] = torch.tensor([0, 0, 0, 0, 0, 1, 2, 2])  # five rows stop at step 0: 3 left, a bucket of 4
    kw = dict(steps=6, ddpd=DDPDOptions(eps=0.1), guidance=Guidance(torch.arange(8)),
              prompt=Prompt(x_init, x_init >= 0), noise=PhiloxNoise(0))
    ref = ddpd_sample(planner, denoiser, 8, 4, 3, **kw)
    for graphs in ("off", "emulate"):
        out = ddpd_sample(planner, denoiser, 8, 4, 3, execution=Execution(fused=True, sync_every=1, graphs=graphs),
                          **kw)
        assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.stop_step, ref.stop_step)


@pytest.mark.parametrize("start, end", [(0.05, 5.0), (5.0, 0.05)])
def test_emulated_graphs_stay_off_under_a_temperature_schedule(nets, made_graphs, start, end):
    """A replay draws at the temperature it was captured with: "emulate", like "auto", runs
    the steps of an annealed run eagerly (it once replayed the first step's temperature),
    whether the temperature rises or falls."""
    kw = dict(steps=12, ddpd=DDPDOptions(stop="budget"), temperature=Temperature(start, end), noise=PhiloxNoise(3))
    n = nets[27]
    ref = ddpd_sample(n["planner"], n["mask"], 4, 8, 27, denoiser_type="mask", **kw)
    out = ddpd_sample(n["planner"], n["mask"], 4, 8, 27, denoiser_type="mask",
                      execution=Execution(fused=True, graphs="emulate"), **kw)
    assert torch.equal(out.tokens, ref.tokens)
    assert made_graphs == []


def test_the_emulation_catches_a_step_tensor_read_under_inference_mode():
    """Under inference mode (where the samplers run) int() of the step tensor is aten.item: refused too."""
    with torch.inference_mode():
        batch = RunningBatch(torch.zeros(2, 3, dtype=torch.long))
        graphs = StepGraphs(batch, torch.device("cpu"), emulate=True)
        graphs.run("read", lambda step: batch.x.add_(int(step)), 0)
        with pytest.raises(RuntimeError, match="read its step tensor back to the host"):
            graphs.run("read", lambda step: batch.x.add_(int(step)), 1)


def test_the_emulation_catches_bool_and_reads_of_a_view_of_the_step_under_inference_mode():
    """Under inference mode bool() of the step tensor is aten.is_nonzero, and int() of a view of
    it (step[None], a select) reads the same storage back to the host: both refused."""
    with torch.inference_mode():
        batch = RunningBatch(torch.zeros(2, 3, dtype=torch.long))
        for read in (lambda step: bool(step), lambda step: int(step[None]), lambda step: int(step.view(1)[0])):
            graphs = StepGraphs(batch, torch.device("cpu"), emulate=True)
            graphs.run("read", lambda step: None, 0)  # the warm-up step: eager
            with pytest.raises(RuntimeError, match="read its step tensor back to the host"):
                graphs.run("read", lambda step: batch.x.add_(read(step)), 1)


def test_a_new_generation_warms_each_kind_of_step_up_eagerly_again():
    """A packed batch has new shapes (new kernels to compile, caches to fill): the first step of
    each key in a new generation runs eagerly, the next is captured, the rest replay."""
    batch = RunningBatch(torch.zeros(2, 3, dtype=torch.long))
    graphs = StepGraphs(batch, torch.device("cpu"), emulate=True)
    steps = []
    for i in range(3):
        graphs.run("step", lambda step: steps.append(step), i)
    assert (graphs.captures, graphs.replays) == (1, 2) and steps[0] == 0 and isinstance(steps[0], int)
    batch.generation += 1
    for i in range(3, 6):
        graphs.run("step", lambda step: steps.append(step), i)
    assert (graphs.captures, graphs.replays) == (2, 4)
    assert isinstance(steps[3], int) and steps[3] == 3  # the new generation's warm-up: eager, its i an int
    assert all(isinstance(s, torch.Tensor) for s in steps[1:3] + steps[4:])


def test_graphs_are_kept_per_key_and_dropped_with_their_generation():
    """Each kind of step keeps its graph within a generation; a new generation frees the old ones."""
    batch = RunningBatch(torch.zeros(2, 3, dtype=torch.long))
    graphs = StepGraphs(batch, torch.device("cpu"), emulate=True)
    for i in range(4):
        graphs.run(i % 2, lambda step: batch.x.add_(step), i)
    assert set(graphs.graphs) == {(0, 0), (0, 1)} and graphs.captures == 2
    batch.generation += 1
    for i in range(2):
        graphs.run(0, lambda step: batch.x.add_(step), i)
    assert set(graphs.graphs) == {(1, 0)} and graphs.captures == 3


def test_graphs_stay_off_without_philox_noise(nets, made_graphs):
    """A replay computes its noise offsets on the device: a TorchNoise run steps eagerly, even when emulating."""
    ddpd_sample(nets[27]["planner"], nets[27]["uniform"], 4, 8, 27, steps=6, noise=TorchNoise(torch.Generator()),
                execution=Execution(fused=True, sync_every=3, graphs="emulate"))
    assert made_graphs == []


def test_a_run_whose_rows_cannot_stop_early_replays_every_step_but_the_first_and_last(nets, made_graphs):
    """Uniform tau-leaping stops no row early: it makes no stop checks, so steps 1 .. T - 2 all replay."""
    tau_leaping_uniform(nets[27]["model"], 4, 8, 27, steps=12, noise=PhiloxNoise(0),
                        execution=Execution(fused=True, sync_every=3, graphs="emulate"))
    assert len(made_graphs) == 1 and made_graphs[0].replays == 10


def test_a_captured_step_counts_its_forward_passes_once_per_replay(monkeypatch):
    """Capturing records a step's kernels without running them, but its Python runs and counts
    the forward passes: the capture takes those back and every replay adds them again. Checked
    with a stand-in for the CUDA graph whose capture runs the step and whose replay runs nothing."""
    class Graph:
        replay = staticmethod(lambda: None)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: contextlib.nullcontext())
    batch = RunningBatch(torch.zeros(2, 3, dtype=torch.long))
    seen = []

    def step(i):  # one denoiser pass on 2 rows saving 4, a planner pass on 3 rows saving 1
        seen.append(i)
        batch.denoiser_calls += 1
        batch.denoiser_rows += 2
        batch.denoiser_rows_saved += 4
        batch.planner_calls += 1
        batch.planner_rows += 3
        batch.planner_rows_saved += 1

    graphs = StepGraphs(batch, torch.device("cpu"), emulate=False)
    for i in range(5):  # a warm-up, a capture and its replay, three more replays
        graphs.run("step", step, i)
    assert (graphs.captures, graphs.replays) == (1, 4) and len(seen) == 2
    assert seen[0] == 0 and seen[1] is graphs.step  # captured on the step tensor, which each replay refills
    assert (batch.denoiser_calls, batch.denoiser_rows, batch.denoiser_rows_saved) == (5, 10, 20)
    assert (batch.planner_calls, batch.planner_rows, batch.planner_rows_saved) == (5, 15, 5)
