"""The precision the networks run in (Execution.dtype, `dtype=` of every sampler).

dtype "bfloat16"/"float16" runs the networks under autocast, "float32" and "auto" on the CPU
as they are; the sampler's own arithmetic stays float32. Checked: the networks see the
precision asked for and the sampler float32 logits; reference and fused runs draw the same
tokens in bfloat16 too from the same logits (not through an output head, whose logits the fused
run keeps in float32); with toy networks whose logits pass through a bfloat16 matmul (the
rounding a bfloat16 network adds), every sampler still follows its exact law within the
sampling noise floor plus the rounding's effect (a stated tolerance).
"""
import pytest
import torch

from ddpd.models import build_model, config_for
from ddpd.sampling import PhiloxNoise, ddpd_sample, draws as sampling_draws, maskgit_sample, tau_leaping_mask
from ddpd.sampling.options import DDPDOptions, Execution
from oracles import laws
from oracles.fixtures import noise, single_thread, toy  # noqa: F401  (single_thread: autouse)
from oracles.stats import empirical, threshold, tv

B = 50_000
ROUNDING = 0.01  # TV the bfloat16 rounding of the toy logits may add


class InPrecision:
    """A toy network whose logits go through a float32 matmul, so that autocast rounds them as a
    low-precision network's would; records the dtype that matmul ran in."""

    def __init__(self, model):
        self.model, self.seen = model, []

    def __call__(self, x, *args):
        logits = self.model(x, *args).float()
        eye = torch.eye(logits.shape[-1])
        out = logits.nan_to_num(neginf=-1e4) @ eye  # -inf would give NaN through a matmul
        self.seen.append(out.dtype)
        return out.float().masked_fill(torch.isneginf(logits), float("-inf"))


@pytest.mark.parametrize("dtype,expected", [("float32", torch.float32), ("auto", torch.float32),
                                            ("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_networks_run_in_the_precision_asked_for_and_the_sampler_in_float32(monkeypatch, dtype, expected):
    m = toy("dir S3 D3").models()
    planner, denoiser = InPrecision(m.planner), InPrecision(m.uniform_denoiser)
    seen_by_ops = []
    original = sampling_draws.reference.planner_select
    monkeypatch.setattr(sampling_draws.reference, "planner_select",
                        lambda logits, *a, **k: seen_by_ops.append(logits.dtype) or original(logits, *a, **k))
    ddpd_sample(planner, denoiser, 8, 3, 3, steps=3, ddpd=DDPDOptions(stop="budget"), execution=Execution(dtype=dtype),
                seed=0)
    assert set(planner.seen) == set(denoiser.seen) == {expected}
    assert set(seen_by_ops) == {torch.float32}


@pytest.mark.parametrize("vocab", [27, 300])
def test_bfloat16_fused_run_draws_what_the_reference_draws(vocab):
    """Given the same logits. The denoiser is called as a plain function: through its output
    head the fused run would draw from float32 logits at the chosen positions
    (sample_from_hidden), where the reference's bfloat16 head rounds them to bfloat16, and the
    two runs agree in law only (the law tests below)."""
    torch.manual_seed(0)
    planner = build_model("planner", config_for("planner", vocab, 8, d_model=16, n_layers=1, n_heads=2)).eval()
    denoiser = build_model("mask-denoiser", config_for("mask-denoiser", vocab, 8, d_model=16, n_layers=1,
                                                       n_heads=2)).eval()
    with torch.inference_mode():
        runs = [ddpd_sample(planner, lambda x, t: denoiser(x, t), 32, 8, vocab, steps=12, denoiser_type="mask",
                            execution=Execution(fused=fused, sync_every=1, dtype="bfloat16"), noise=PhiloxNoise(3))
                for fused in (False, True)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert torch.equal(runs[0].stop_step, runs[1].stop_step)


CASES = {
    "ddpd uniform A": lambda m, **kw: ddpd_sample(InPrecision(m.planner), InPrecision(m.uniform_denoiser), B, 3, 3,
                                                  steps=10, ddpd=DDPDOptions(eps=0.3), **kw),
    "ddpd mask B": lambda m, **kw: ddpd_sample(InPrecision(m.planner), InPrecision(m.mask_denoiser), B, 3, 3, steps=8,
                                               ddpd=DDPDOptions(stop="budget"), denoiser_type="mask", **kw),
    "tau mask eta 1": lambda m, **kw: tau_leaping_mask(InPrecision(m.mask_denoiser), B, 3, 3, steps=8, eta=1.0, **kw),
    "maskgit": lambda m, **kw: maskgit_sample(InPrecision(m.mask_denoiser), B, 3, 3, steps=3, choice_temperature=1.0,
                                              **kw),
}
LAWS = {
    "ddpd uniform A": lambda p: laws.ddpd_planner_clock_law(p, 10, ddpd=DDPDOptions(stop="eps", eps=0.3)),
    "ddpd mask B": lambda p: laws.ddpd_planner_clock_law(p, 8, ddpd=DDPDOptions(stop="budget"), denoiser_type="mask"),
    "tau mask eta 1": lambda p: laws.tau_leaping_mask_law(p, 8, eta=1.0),
    "maskgit": lambda p: laws.maskgit_law(p, 3, choice_temperature=1.0),
}


@pytest.mark.parametrize("name", CASES)
def test_bfloat16_networks_keep_the_exact_law_within_rounding(name):
    problem = toy("dir S3 D3")
    result = CASES[name](problem.models(), execution=Execution(fused=True, dtype="bfloat16"), seed=5)
    law = LAWS[name](problem)
    distance = tv(empirical(problem.index(result.tokens), problem.N), law)
    assert distance < threshold(law, B) + ROUNDING, f"{name}: TV {distance:.4f}"


@pytest.mark.parametrize("denoiser_type", ["mask", "uniform"])
@pytest.mark.parametrize("clock", ["planner", "exact"])
def test_float64_networks_run_fused_as_they_run_the_reference(denoiser_type, clock):
    """The fused head takes float32/bfloat16/float16 weights: a float64 network's denoiser runs
    whole and its logits are drawn as the reference draws them (it raised a TypeError about a
    `hidden` argument the user never passed)."""
    from oracles.fixtures import tiny_network

    planner = tiny_network("planner", 300, 0, 40.0).double()
    denoiser = tiny_network(f"{denoiser_type}-denoiser", 300, 1, 20.0).double()
    runs = [ddpd_sample(planner, denoiser, 6, 8, 300, steps=12, seed=3, denoiser_type=denoiser_type,
                        ddpd=DDPDOptions(clock=clock), execution=Execution(fused=fused)) for fused in (False, True)]
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].stop_step, runs[1].stop_step)
