"""A network that returns NaN during a run is counted (SampleResult.*_nan_passes) and warned
about once per run (NaNOutputWarning), on every path, without a synchronisation per step."""
import warnings

import pytest
import torch

from ddpd.sampling import (
    NaNOutputWarning,
    PhiloxNoise,
    batch as sampling_batch,
    ddpd_sample,
    ddpd_sample_uniform,
    maskgit_sample,
    tau_leaping_mask,
    tau_leaping_planned,
)
from ddpd.sampling.options import DDPDOptions, Execution, Guidance
from oracles.fixtures import single_thread, tiny_network  # noqa: F401  (single_thread: autouse)

V, D, B = 27, 8, 6


class Poisoned(torch.nn.Module):
    """A network whose output is NaN in the rows holding a multiple of 3 at position `at` (the
    mask id 27 included): a function of its input, so runs that draw the same samples meet the
    same NaN. Counts on the host the calls with a NaN row (`nan_calls`), which in a reference
    run (every row of a pass used) are the passes the run must count. Keeps `hidden` and
    `head` (the fused head path) when the network has them, the NaN then in hidden states."""

    def __init__(self, network, at: int):
        super().__init__()
        self.network, self.at, self.nan_calls = network, at, 0
        if hasattr(network, "hidden"):
            self.head = network.head
            self.hidden = self._poisoned(network.hidden)
        self.forward = self._poisoned(network.forward)

    def _poisoned(self, fn):
        def call(x, *args, **kwargs):
            out = fn(x, *args, **kwargs)
            rows = x[:, self.at] % 3 == 0
            self.nan_calls += bool(rows.any())
            return out.masked_fill(rows.view(-1, *[1] * (out.dim() - 1)), float("nan"))
        return call


def _runs():
    """name -> (run(planner, denoiser, **kw), denoiser kind)."""
    return {
        "ddpd mask": (lambda p, d, **kw: ddpd_sample(p, d, B, D, V, steps=12, denoiser_type="mask", **kw), "mask"),
        "ddpd uniform A+B": (lambda p, d, **kw: ddpd_sample(p, d, B, D, V, steps=12, ddpd=DDPDOptions(stop="budget"),
                                                            **kw), "uniform"),
        "ddpd exact clock": (lambda p, d, **kw: ddpd_sample(p, d, B, D, V, steps=30, ddpd=DDPDOptions(clock="exact"),
                                                            denoiser_type="mask", **kw), "mask"),
        "uniform model, exact clock": (lambda p, d, **kw: ddpd_sample_uniform(d, B, D, V, steps=30,
                                                                              ddpd=DDPDOptions(clock="exact"),
                                                                              **kw), "model"),
        "tau-leaping P x D": (lambda p, d, **kw: tau_leaping_planned(p, d, B, D, V, steps=6, denoiser_type="mask",
                                                                     **kw), "mask"),
        "tau-leaping mask": (lambda p, d, **kw: tau_leaping_mask(d, B, D, V, steps=6, **kw), "mask"),
        "maskgit": (lambda p, d, **kw: maskgit_sample(d, B, D, V, steps=6, **kw), "mask"),
    }


KINDS = {"mask": "mask-denoiser", "uniform": "uniform-denoiser", "model": "uniform"}
EXECUTIONS = {"fused": Execution(fused=True), "graphs": Execution(fused=True, graphs="emulate"),
              "no compaction": Execution(fused=True, compaction=False),
              "sync every 4": Execution(fused=True, sync_every=4)}


def _sample(name, execution=Execution()):
    run, kind = _runs()[name]
    planner = Poisoned(tiny_network("planner", V, 0, 40.0), at=1)
    denoiser = Poisoned(tiny_network(KINDS[kind], V, 1, 20.0), at=0)
    with warnings.catch_warnings(record=True) as caught, torch.inference_mode():
        warnings.simplefilter("always")
        result = run(planner, denoiser, noise=PhiloxNoise(3), execution=execution)
    return result, planner, denoiser, [w for w in caught if issubclass(w.category, NaNOutputWarning)]


@pytest.mark.parametrize("name", list(_runs()))
def test_the_passes_with_nan_are_counted_and_warned_about_once(name):
    """Every path counts the passes the reference counts, for the same samples: rows a fused
    step evaluates but does not use (finished rows it keeps, rows that draw nothing) do not count."""
    reference, planner, denoiser, warned = _sample(name)
    assert reference.denoiser_nan_passes == denoiser.nan_calls > 0
    assert reference.planner_nan_passes == planner.nan_calls
    assert len(warned) == 1
    message = str(warned[0].message)
    assert f"the denoiser returned NaN or +inf in {denoiser.nan_calls} of {reference.denoiser_calls} passes" in message
    assert ("the planner returned NaN" in message) == (planner.nan_calls > 0)
    for execution in EXECUTIONS.values():
        fused, _, _, warned = _sample(name, execution)
        assert torch.equal(fused.tokens, reference.tokens), execution
        assert (fused.planner_nan_passes, fused.denoiser_nan_passes) == \
            (reference.planner_nan_passes, reference.denoiser_nan_passes), execution
        assert len(warned) == 1


def test_an_infinite_hidden_state_counts_as_nan():
    """inf in a hidden state gives NaN logits in the head (inf * w - inf * w'): the fused run,
    which sees hidden states only, counts it as the reference counts the logits."""
    planner, denoiser = tiny_network("planner", V, 0, 40.0), tiny_network("mask-denoiser", V, 1, 20.0)
    hidden = denoiser.hidden

    def infinite(x, t):
        h = hidden(x, t).clone()
        h[..., :2] = float("inf")
        return h

    denoiser.hidden = infinite
    denoiser.forward = lambda x, t: denoiser.head(infinite(x, t))
    for fused in (False, True):
        with pytest.warns(NaNOutputWarning), torch.inference_mode():
            result = ddpd_sample(planner, denoiser, B, D, V, steps=8, denoiser_type="mask", seed=0,
                                 execution=Execution(fused=fused))
        assert result.denoiser_nan_passes == result.denoiser_calls == 8


@pytest.mark.parametrize("fused", [False, True])
def test_a_run_without_nan_says_nothing(fused):
    planner, denoiser = tiny_network("planner", V, 0, 40.0), tiny_network("mask-denoiser", V, 1, 20.0)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("error")
        result = ddpd_sample(planner, denoiser, B, D, V, steps=12, denoiser_type="mask", seed=1,
                             execution=Execution(fused=fused))
    assert result.planner_nan_passes == result.denoiser_nan_passes == 0


def test_guidance_that_makes_nan_is_counted():
    """inf - inf in classifier-free guidance is a NaN of the guided logits the sampler draws from."""
    def denoiser(x, t, labels=None):
        logits = torch.zeros(*x.shape, V)
        logits[..., 1] = float("inf")
        return logits

    # guided: two calls a step (the callable names no null label), both with +inf
    with pytest.warns(NaNOutputWarning, match=r"the denoiser returned NaN or \+inf in 12 of 12 passes"):
        result = maskgit_sample(denoiser, B, D, V, steps=6, seed=0,
                                guidance=Guidance(torch.zeros(B, dtype=torch.long), scale=2.0))
    assert result.denoiser_nan_passes == 12


def test_one_infinite_hidden_feature_counts_on_both_paths():
    """One inf feature of a hidden state makes +-inf logits, no NaN: the fused run (hidden
    states) counted it and the reference (logits, NaN only) did not."""
    planner, network = tiny_network("planner", V, 0, 40.0), tiny_network("uniform-denoiser", V, 1, 20.0)

    class OneInfinite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.network, self.head = network, network.head

        def hidden(self, x, t):
            h = self.network.hidden(x, t)
            return h.index_fill(2, torch.tensor([0]), float("inf")).where((x.sum(-1) % 2 == 0)[:, None, None], h)

        def forward(self, x, t):
            return self.head(self.hidden(x, t))

    counts = []
    for fused in (False, True):
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore", NaNOutputWarning)
            result = ddpd_sample(planner, OneInfinite(), B, D, V, steps=8, ddpd=DDPDOptions(stop="budget"), seed=0,
                                 execution=Execution(fused=fused))
        counts.append(result.denoiser_nan_passes)
    assert counts[0] == counts[1] > 0


def test_the_warning_names_the_line_that_called_the_sampler():
    """Python's filters key a warning on its location: inside ddpd, one internal line, every run
    of a program after the first was silent; at the caller's line, as for any library."""
    def denoiser(x, t):
        return torch.full((*x.shape, V), float("nan"))

    with pytest.warns(NaNOutputWarning) as caught:
        maskgit_sample(denoiser, B, D, V, steps=2, seed=0)
    assert caught[0].filename == __file__


def test_guidance_with_nan_in_the_null_label_half_of_one_call_is_counted():
    """A network that names its null label is called once a step on 2B rows: a NaN in its
    unconditional half alone counts that pass."""
    class NullNaN:
        null_label = 3

        def __call__(self, x, t, labels=None):
            logits = torch.zeros(*x.shape, V)
            return logits.masked_fill((labels == self.null_label)[:, None, None], float("nan"))

    with pytest.warns(NaNOutputWarning, match=r"the denoiser returned NaN or \+inf in 6 of 6 passes"):
        result = maskgit_sample(NullNaN(), B, D, V, steps=6, seed=0,
                                guidance=Guidance(torch.zeros(B, dtype=torch.long), scale=2.0))
    assert result.denoiser_calls == result.denoiser_nan_passes == 6


def test_the_warning_counts_the_bad_passes_out_of_all_passes():
    """The message says how many passes of each network held NaN, out of how many it made."""
    message = sampling_batch.nan_warning(1, 4, 0, 3)
    assert message.startswith("the planner returned NaN in 1 of 4 passes: ")
    assert sampling_batch.nan_warning(0, 4, 2, 5).startswith("the denoiser returned NaN or +inf in 2 of 5 passes: ")
    assert sampling_batch.nan_warning(0, 4, 0, 5) == ""
    # a single uniform model's passes, all counted as the denoiser's, named as the model
    assert sampling_batch.nan_warning(0, 0, 2, 5, "uniform model").startswith(
        "the uniform model returned NaN or +inf in 2 of 5 passes: ")
