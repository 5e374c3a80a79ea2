"""The fused samplers on a GPU: CUDA graphs replay what eager steps draw, and no step waits
for the host except at the stop checks. Skipped without a CUDA device."""
import pytest
import torch

from ddpd.models import build_model, config_for, prepare_for_sampling
from ddpd.sampling import NaNOutputWarning, ddpd_sample, ddpd_sample_uniform, mask_sample, tau_leaping_planned
from ddpd.sampling.graphs import StepGraphs
from ddpd.sampling.options import DDPDOptions, Execution, Truncation
from ddpd.sampling.policies import ConfidenceThreshold, ErrorBudget, MaskGIT, ReMDM, ddpd_steps

pytestmark = pytest.mark.gpu


def tiny(kind, vocab, seed, dtype="float32"):
    torch.manual_seed(seed)
    model = build_model(kind, config_for(kind, vocab, 64, d_model=64, n_layers=2, n_heads=4))
    return prepare_for_sampling(model, dtype, "cuda")


@pytest.fixture(scope="module")
def nets():
    return {dtype: dict(planner=tiny("planner", 300, 0, dtype), mask=tiny("mask-denoiser", 300, 1, dtype),
                        uniform=tiny("uniform-denoiser", 300, 2, dtype), model=tiny("uniform", 300, 3, dtype))
            for dtype in ("float32", "bfloat16")}


RUNS = {
    "planner clock, mask, A": lambda n, **kw: ddpd_sample(n["planner"], n["mask"], 64, 64, 300, steps=96,
                                                          denoiser_type="mask", **kw),
    "planner clock, uniform, B, k=4 x8": lambda n, **kw: ddpd_sample(
        n["planner"], n["uniform"], 64, 64, 300, steps=48, ddpd=DDPDOptions(stop="budget", k=4, parallel_steps=8),
        **kw),
    "exact clock, uniform": lambda n, **kw: ddpd_sample(n["planner"], n["uniform"], 64, 64, 300, steps=400,
                                                        ddpd=DDPDOptions(clock="exact"), **kw),
    "single uniform model": lambda n, **kw: ddpd_sample_uniform(n["model"], 64, 64, 300, steps=96, **kw),
    "planner clock, mask, error budget": lambda n, **kw: ddpd_sample(
        n["planner"], n["mask"], 64, 64, 300, steps=24, denoiser_type="mask", ddpd=DDPDOptions(
            stop="budget", policy=ErrorBudget(1.0, 64, spread="cosine", known_noise=True, plan_every=4,
                                              choice_temperature=4.5, revise_above=0.5)), **kw),
    "mask loop, MaskGIT": lambda n, **kw: mask_sample(n["mask"], 64, 64, 300, steps=32, policy=MaskGIT(), **kw),
    "mask loop, ReMDM loop": lambda n, **kw: mask_sample(n["mask"], 64, 64, 300, steps=32,
                                                         policy=ReMDM("loop", eta=0.1), **kw),
    "tau-leaping planned, mask": lambda n, **kw: tau_leaping_planned(n["planner"], n["mask"], 64, 64, 300, steps=32,
                                                                     denoiser_type="mask", **kw),
}


@pytest.fixture
def made(monkeypatch):
    """The StepGraphs the test's runs make, in order."""
    made = []
    original = StepGraphs.__init__

    def init(self, *args, **kwargs):  # __init__ must return None: no lambda returning a tuple
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(StepGraphs, "__init__", init)
    return made


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", RUNS)
def test_graph_replays_draw_what_eager_steps_draw(nets, name, dtype, made):
    with torch.inference_mode():
        eager = RUNS[name](nets[dtype], seed=3, device="cuda",
                           execution=Execution(fused=True, graphs="off", dtype=dtype))
        replayed = RUNS[name](nets[dtype], seed=3, device="cuda", execution=Execution(fused=True, dtype=dtype))
    assert made and made[-1].replays > 0 and not made[-1].emulate
    assert torch.equal(eager.tokens, replayed.tokens) and torch.equal(eager.stop_step, replayed.stop_step)
    assert (eager.planner_calls, eager.denoiser_calls) == (replayed.planner_calls, replayed.denoiser_calls)


def _ddpd_policy(policy: ErrorBudget):
    return lambda n, **kw: ddpd_sample(n["planner"], n["mask"], 16, 64, 300, steps=ddpd_steps(16, policy),
                                       denoiser_type="mask", ddpd=DDPDOptions(policy=policy), **kw)


# The commit policies benchmarks/gpu_parallel.py times (its POLICIES, MaskGIT and the threshold
# 0.9), as it runs them, at a budget of 16 network passes.
POLICY_RUNS = {
    "error budget without planner passes": _ddpd_policy(ErrorBudget(
        0.0, 64, spread="cosine", known_noise=True, plan_every=1000, choice_temperature=4.5)),
    "error budget revising every 4 steps": _ddpd_policy(ErrorBudget(
        1.0, 64, spread="cosine", known_noise=True, plan_every=4, choice_temperature=4.5, revise_above=0.5)),
    "mask loop, MaskGIT": lambda n, **kw: mask_sample(n["mask"], 16, 64, 300, steps=16, policy=MaskGIT(), **kw),
    "mask loop, threshold 0.9": lambda n, **kw: mask_sample(n["mask"], 16, 64, 300, steps=16,
                                                            policy=ConfidenceThreshold(0.9), **kw),
}


@pytest.mark.parametrize("name", POLICY_RUNS)
def test_commit_policies_in_graph_replays_draw_the_reference_tokens(nets, name, made):
    """Fused with CUDA graphs, as the benchmark runs them, the policies commit the tokens the
    reference path (fused=False) commits on the same device."""
    with torch.inference_mode():
        reference = POLICY_RUNS[name](nets["float32"], seed=7, device="cuda", execution=Execution(dtype="float32"))
        replayed = POLICY_RUNS[name](nets["float32"], seed=7, device="cuda",
                                     execution=Execution(fused=True, dtype="float32"))
    assert made and made[-1].replays > 0 and not made[-1].emulate
    assert torch.equal(reference.tokens, replayed.tokens) and torch.equal(reference.commits, replayed.commits)
    assert torch.equal(reference.passes, replayed.passes)
    assert reference.tokens_per_pass > 1  # several tokens a pass: the policy chose them


CUT = dict(truncation=Truncation(top_k=40, top_p=0.9, min_p=0.01))


@pytest.mark.parametrize("name", ["planner clock, mask, A", "exact clock, uniform"])
def test_truncated_graph_replays_draw_what_eager_steps_draw(nets, name):
    """top-k / top-p / min-p inside the captured steps (the head's truncated draw)."""
    with torch.inference_mode():
        eager = RUNS[name](nets["bfloat16"], seed=4, device="cuda", execution=Execution(fused=True, graphs="off"),
                           **CUT)
        replayed = RUNS[name](nets["bfloat16"], seed=4, device="cuda", execution=Execution(fused=True), **CUT)
        untruncated = RUNS[name](nets["bfloat16"], seed=4, device="cuda", execution=Execution(fused=True))
    assert torch.equal(eager.tokens, replayed.tokens) and torch.equal(eager.stop_step, replayed.stop_step)
    assert not torch.equal(eager.tokens, untruncated.tokens)


@pytest.mark.parametrize("cut", [{}, CUT], ids=["untruncated", "truncated"])
@pytest.mark.parametrize("graphs", ["off", "auto"])
def test_no_host_synchronisation_inside_a_step(nets, graphs, cut):
    n = nets["bfloat16"]
    names = ("planner clock, mask, A", "exact clock, uniform", "planner clock, mask, error budget",
             "mask loop, MaskGIT", "tau-leaping planned, mask")
    with torch.inference_mode():
        for name in names:  # a first run fills the ops' caches (a host-to-device copy each)
            RUNS[name](n, seed=5, device="cuda", execution=Execution(fused=True, graphs=graphs, dtype="bfloat16"),
                       **cut)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # the stop checks and the final count allow theirs
        try:
            for name in names:
                RUNS[name](n, seed=6, device="cuda", execution=Execution(fused=True, graphs=graphs, dtype="bfloat16"),
                           **cut)
        finally:
            torch.cuda.set_sync_debug_mode(0)


def test_graph_replays_count_the_passes_that_return_nan():
    """The NaN count is a device counter the captured step updates: every replayed pass is
    counted, as every eager one is (NaN embeddings: NaN in every pass; the norm gives the
    exact bias on a constant row of huge values, so overflow alone would not do)."""
    planner, denoiser = tiny("planner", 300, 0), tiny("mask-denoiser", 300, 1)
    with torch.no_grad():
        denoiser.backbone.embed.weight.fill_(float("nan"))
    runs = {}
    with torch.inference_mode(), pytest.warns(NaNOutputWarning):
        for graphs in ("off", "auto"):
            runs[graphs] = ddpd_sample(planner, denoiser, 64, 64, 300, steps=96, denoiser_type="mask", seed=2,
                                       device="cuda", execution=Execution(fused=True, graphs=graphs))
    eager, replayed = runs["off"], runs["auto"]
    assert torch.equal(eager.tokens, replayed.tokens)
    assert eager.denoiser_nan_passes == replayed.denoiser_nan_passes == replayed.denoiser_calls == 96
    assert eager.planner_nan_passes == replayed.planner_nan_passes == 0
