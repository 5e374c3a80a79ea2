"""A network that returns NaN during a run is counted (SampleResult.*_nan_passes) and warned
about once per run (NaNOutputWarning), on every path, without a synchronisation per step."""
import warnings

import pytest
import torch

from oracles.fixtures import single_thread, tiny_network  # noqa: F401  (single_thread: autouse)
from ddpd.sampling import (NaNOutputWarning, PhiloxNoise, ddpd_sample, maskgit_sample, tau_leaping_mask,
                           tau_leaping_planned)

V, D, B = 27, 8, 6


class EveryThird(torch.nn.Module):
    """A network that writes NaN into one logit of one row in every third call: the passes
    with a NaN are known in advance. Keeps `hidden` and `head` (the fused head path) when
    the network has them, the NaN then in a hidden state."""

    def __init__(self, network):
        super().__init__()
        self.network, self.calls = network, 0
        if hasattr(network, "hidden"):
            self.head = network.head
            self.hidden = self._poisoned(network.hidden)
        self.forward = self._poisoned(network.forward)

    def _poisoned(self, fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs).clone()
            self.calls += 1
            if self.calls % 3 == 0:
                out[0, 0, ...].view(-1)[-1] = float("nan")
            return out
        return call

    def expected(self) -> int:
        return self.calls // 3


def _runs():
    """name -> (run(planner, denoiser, **kw), which networks it calls)."""
    return {
        "ddpd mask": (lambda p, d, **kw: ddpd_sample(p, d, B, D, V, steps=12, denoiser_type="mask", **kw),
                      ("planner", "denoiser")),
        "ddpd uniform A+B": (lambda p, d, **kw: ddpd_sample(p, d, B, D, V, steps=12, stop="budget", **kw),
                             ("planner", "denoiser")),
        "tau-leaping P x D": (lambda p, d, **kw: tau_leaping_planned(p, d, B, D, V, steps=6, denoiser_type="mask",
                                                                     **kw), ("planner", "denoiser")),
        "tau-leaping mask": (lambda p, d, **kw: tau_leaping_mask(d, B, D, V, steps=6, **kw), ("denoiser",)),
        "maskgit": (lambda p, d, **kw: maskgit_sample(d, B, D, V, steps=6, **kw), ("denoiser",)),
    }


@pytest.mark.parametrize("execution", [dict(fused=False), dict(fused=True), dict(fused=True, graphs="emulate"),
                                       dict(fused=True, compaction=False, sync_every=4)])
@pytest.mark.parametrize("name", list(_runs()))
def test_nan_passes_are_counted_and_warned_about_once(name, execution):
    run, networks = _runs()[name]
    denoiser_type = "uniform-denoiser" if "uniform" in name else "mask-denoiser"
    planner = EveryThird(tiny_network("planner", V, 0, 40.0))
    denoiser = EveryThird(tiny_network(denoiser_type, V, 1, 20.0))
    with warnings.catch_warnings(record=True) as caught, torch.inference_mode():
        warnings.simplefilter("always")
        result = run(planner, denoiser, noise=PhiloxNoise(3), **execution)
    assert denoiser.calls == result.denoiser_calls > 0
    assert result.denoiser_nan_passes == denoiser.expected() > 0
    assert result.planner_nan_passes == (planner.expected() if "planner" in networks else 0)
    assert planner.calls == result.planner_calls
    nan = [w for w in caught if issubclass(w.category, NaNOutputWarning)]
    assert len(nan) == 1, [str(w.message) for w in caught]
    message = str(nan[0].message)
    assert f"the denoiser returned NaN in {denoiser.expected()} of {denoiser.calls} passes" in message
    assert ("the planner returned NaN" in message) == ("planner" in networks and planner.expected() > 0)
    assert torch.all((result.tokens >= 0) & (result.tokens < V))


@pytest.mark.parametrize("fused", [False, True])
def test_a_run_without_nan_says_nothing(fused):
    planner, denoiser = tiny_network("planner", V, 0, 40.0), tiny_network("mask-denoiser", V, 1, 20.0)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("error")
        result = ddpd_sample(planner, denoiser, B, D, V, steps=12, denoiser_type="mask", seed=1, fused=fused)
    assert result.planner_nan_passes == result.denoiser_nan_passes == 0


def test_guidance_that_makes_nan_is_counted():
    """inf - inf in classifier-free guidance is a NaN of the guided logits the sampler draws from."""
    def denoiser(x, t, labels=None):
        logits = torch.zeros(*x.shape, V)
        logits[..., 1] = float("inf")
        return logits

    with pytest.warns(NaNOutputWarning, match="the denoiser returned NaN in 6 of 6 passes"):
        result = maskgit_sample(denoiser, B, D, V, steps=6, seed=0, labels=torch.zeros(B, dtype=torch.long),
                                guidance_scale=2.0)
    assert result.denoiser_nan_passes == 6
