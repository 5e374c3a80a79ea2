"""top_k / top_p / min_p in the samplers (ddpd.sampling.options.Truncation).

(a) Law: one step of mask tau-leaping from the all-mask sequence unmasks every position
    at once, each drawn from the denoiser's marginal p(x^d | all masked); with exact
    networks on a toy, the samples' per-position law must be that marginal truncated and
    renormalised (reference and fused runs; the cut tokens never drawn).
(b) Mechanics: every sampler's fused run draws what its reference run draws under each
    truncation; top_k = 1 is the greedy run (temperature 0), token for token; a cut
    changes the samples; bad values are refused by the sampler and by ddpd-sample.
"""
import numpy as np
import pytest
import torch

from ddpd.sampling import (
    PhiloxNoise,
    Truncation,
    ddpd_sample,
    ddpd_sample_uniform,
    maskgit_sample,
    tau_leaping_mask,
    tau_leaping_planned,
    tau_leaping_uniform,
)
from ddpd.sampling.options import DDPDOptions, Execution
from oracles.fixtures import single_thread, tiny_network, toy  # noqa: F401  (single_thread: autouse)

CUTS = {"top_k=2": Truncation(top_k=2), "top_p=0.5": Truncation(top_p=0.5), "min_p=0.3": Truncation(min_p=0.3),
        "top_k=3 top_p=0.8": Truncation(top_k=3, top_p=0.8)}


def truncated(p: torch.Tensor, cut: Truncation) -> torch.Tensor:
    """p [..., S] truncated by sorting (the definition, ddpd.ops.sample_categorical: top_p
    over what top_k keeps, renormalised) and renormalised."""
    top_k, top_p, min_p = cut.top_k, cut.top_p, cut.min_p
    order = p.argsort(-1, descending=True)
    sorted_p = p.gather(-1, order)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if top_k is not None:
        keep[..., top_k:] = False
    if top_p is not None:
        kept = sorted_p * keep
        keep &= kept.cumsum(-1) - kept < top_p * kept.sum(-1, keepdim=True)
    if min_p is not None:
        keep &= sorted_p >= min_p * sorted_p[..., :1]
    kept = torch.zeros_like(p).scatter(-1, order, sorted_p * keep)
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("cut", list(CUTS))
def test_one_step_draws_follow_the_truncated_marginals(cut, fused):
    models, S, D, n = toy("sparse S4 D3").models(), 4, 3, 40_000
    masked = torch.full((1, D), S)
    law = truncated(models.mask_denoiser(masked, torch.zeros(1)).softmax(-1)[0].double(), CUTS[cut])
    out = tau_leaping_mask(models.mask_denoiser, n, D, S, steps=1, seed=3, execution=Execution(fused=fused),
                           truncation=CUTS[cut]).tokens
    assert (out < S).all()
    counts = torch.stack([torch.bincount(out[:, d], minlength=S) for d in range(D)]).double()
    assert ((law == 0) <= (counts == 0)).all(), "a cut token was drawn"
    tv = 0.5 * (counts / n - law).abs().sum(-1)
    assert (tv < 0.015).all(), (cut, tv, law)  # 40k draws of <= 4 states: TV ~ 0.005


@pytest.fixture(scope="module")
def nets():
    """Tiny random networks at V = 300 (two tiles) with spread logits, so every cut bites."""
    v = 300
    return dict(planner=tiny_network("planner", v, 0, 40.0), uniform=tiny_network("uniform-denoiser", v, 1, 3.0),
                mask=tiny_network("mask-denoiser", v, 2, 3.0), model=tiny_network("uniform", v, 3, 3.0))


def run_sampler(name, nets, **kw):
    b, d, v = 6, 8, 300
    common = dict(seed=11, **kw)
    calls = {
        "ddpd uniform": lambda: ddpd_sample(nets["planner"], nets["uniform"], b, d, v, steps=12, **common),
        "ddpd mask": lambda: ddpd_sample(nets["planner"], nets["mask"], b, d, v, steps=12, denoiser_type="mask",
                                         **common),
        "ddpd exact clock": lambda: ddpd_sample(nets["planner"], nets["uniform"], b, d, v, steps=12,
                                                ddpd=DDPDOptions(clock="exact"), **common),
        "ddpd uniform model": lambda: ddpd_sample_uniform(nets["model"], b, d, v, steps=12, **common),
        "tau mask": lambda: tau_leaping_mask(nets["mask"], b, d, v, steps=6, eta=0.5, **common),
        "tau uniform": lambda: tau_leaping_uniform(nets["model"], b, d, v, steps=6, **common),
        "tau planned": lambda: tau_leaping_planned(nets["planner"], nets["uniform"], b, d, v, steps=6, **common),
        "maskgit": lambda: maskgit_sample(nets["mask"], b, d, v, steps=4, **common),
    }
    return calls[name]().tokens


SAMPLERS = ["ddpd uniform", "ddpd mask", "ddpd exact clock", "ddpd uniform model", "tau mask", "tau uniform",
            "tau planned", "maskgit"]


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("name", SAMPLERS)
def test_fused_runs_draw_what_reference_runs_draw(nets, name, cut):
    reference = run_sampler(name, nets, truncation=CUTS[cut])
    assert torch.equal(run_sampler(name, nets, execution=Execution(fused=True), truncation=CUTS[cut]), reference)


@pytest.mark.parametrize("name", ["ddpd uniform", "ddpd mask", "ddpd exact clock"])
def test_graph_replayed_steps_draw_what_eager_steps_draw(nets, name):
    """The fused DDPD steps replayed from graphs (the CPU emulation of CUDA graphs) under a cut."""
    cut = Truncation(top_k=3, top_p=0.8)
    assert torch.equal(run_sampler(name, nets, execution=Execution(fused=True, graphs="emulate"), truncation=cut),
                       run_sampler(name, nets, truncation=cut))


@pytest.mark.parametrize("name", SAMPLERS)
def test_top_k_1_is_the_greedy_run_and_a_cut_changes_the_samples(nets, name):
    greedy = run_sampler(name, nets, temperature=0.0)
    assert torch.equal(run_sampler(name, nets, truncation=Truncation(top_k=1)), greedy)
    assert torch.equal(run_sampler(name, nets, execution=Execution(fused=True), truncation=Truncation(top_k=1)), greedy)
    assert not torch.equal(run_sampler(name, nets, truncation=Truncation(top_p=0.3)), run_sampler(name, nets))


@pytest.mark.parametrize("cut,error,match", [
    (dict(top_k=0), ValueError, "top_k"), (dict(top_p=0.0), ValueError, "top_p"),
    (dict(top_p=1.5), ValueError, "top_p"), (dict(min_p=-0.1), ValueError, "min_p"),
    (dict(min_p=1.5), ValueError, r"min_p must be in \[0.0, 1.0\], got 1.5"),
    (dict(top_k=2.5), TypeError, "top_k"),
])
def test_bad_truncations_are_refused(cut, error, match):
    with pytest.raises(error, match=match):
        Truncation(**cut)


def test_each_cut_takes_its_closed_end_and_is_handed_to_the_draws_even_when_it_keeps_everything():
    """top_p = 1 and min_p in {0, 1} are cuts, not errors; a cut that keeps every token is still
    one of the draws' keywords (controls), and top_k comes back as a Python int."""
    assert Truncation(top_p=1.0).top_p == 1.0 and Truncation(min_p=1.0).min_p == 1.0
    assert Truncation().controls() == {}
    controls = Truncation(top_k=np.int64(3), min_p=0.0).controls()
    assert controls == {"top_k": 3, "min_p": 0.0} and type(controls["top_k"]) is int
    assert Truncation(top_k=1, top_p=1.0, min_p=1.0).controls() == {"top_k": 1, "top_p": 1.0, "min_p": 1.0}


def test_a_truncation_given_as_a_dict_is_refused(nets):
    with pytest.raises(TypeError, match="truncation must be a Truncation"):
        tau_leaping_mask(nets["mask"], 2, 4, 300, steps=2, noise=PhiloxNoise(0), truncation=dict(top_k=2))
