"""Whole DDPD sampler runs: early-stop compaction, and the fused path against the reference.

Run: `pytest benchmarks/bench_sampler.py --benchmark-only` (about a minute on one
CPU thread). Models: tiny randomly initialised ddpd.models transformers.

- early stop: a planner network whose output is replaced by a rule, so that about
  half of the rows become clean early. A row whose first token is in the lower half
  of the vocabulary is 'easy': positions 1..5 are noise while they are not token
  0, the rest clean; other rows have every position but 0 noisy, always. The
  denoiser's head is biased towards token 0, so an easy row stops after about 5
  steps of the 96-step budget and the others never. The fused path with
  compaction is timed against the same run with compaction=False (finished rows
  frozen in the batch): same samples (checked), and compaction must run at most
  60% of the uncompacted run's model row-evaluations (checked; counts, not times).
  Both are timed over EARLY_ROUNDS rounds after a warm-up (the ratio is of medians).
- fused vs reference: ddpd_sample(execution=Execution(fused=True)) against the reference sampler, same
  seed, same samples (checked), with a mask denoiser on text8's 27 symbols and with
  a uniform denoiser on GPT-2's 50257 tokens (where the reference applies the head
  at every position of every row, and the fused path at one position per row).
The end-to-end runs are timed once each (after a warm-up). Ratios are printed; the
session summary (benchmarks/conftest.py) repeats them.
"""
import pytest
import torch

from ddpd.models import build_model, config_for
from ddpd.sampling import ddpd_sample
from ddpd.sampling.options import DDPDOptions, Execution

EARLY = dict(vocab=27, length=32, batch=128, steps=96, easy_span=6, d_model=64, n_layers=2, n_heads=4)
EARLY_SHAPE = (EARLY["batch"], EARLY["length"], EARLY["vocab"])  # the rows' case: batch x length x vocabulary
EARLY_ROUNDS = 3  # the early-stop ratio is of medians over this many timed rounds (after one warm-up)
_runs: dict = {}


def tiny(kind, vocab, length, seed, **fields):
    torch.manual_seed(seed)
    fields = {"d_model": 32, "n_layers": 1, "n_heads": 2, **fields}
    return build_model(kind, config_for(kind, vocab, length, **fields)).eval()


class RulePlanner(torch.nn.Module):
    """A planner network's cost with a rule's output (see the module docstring)."""

    def __init__(self, net, vocab: int, easy_span: int):
        super().__init__()
        self.net, self.vocab, self.easy_span = net, vocab, easy_span

    def forward(self, x):
        cost = self.net(x)
        positions = torch.arange(x.shape[1], device=x.device)
        easy = x[:, :1] < self.vocab // 2
        noisy = torch.where(easy, (x != 0) & (positions < self.easy_span), True) & (positions > 0)
        return torch.where(noisy, 4.0, -30.0) + 0.0 * cost


@pytest.fixture(scope="module")
def early_models():
    v, d = EARLY["vocab"], EARLY["length"]
    fields = {f: EARLY[f] for f in ("d_model", "n_layers", "n_heads")}
    denoiser = tiny("uniform-denoiser", v, d, 1, **fields)
    with torch.no_grad():
        denoiser.head.bias[0] += 8.0
    return RulePlanner(tiny("planner", v, d, 0, **fields), v, EARLY["easy_span"]), denoiser


def early_run(models, compaction):
    planner, denoiser = models
    with torch.inference_mode():
        result = ddpd_sample(planner, denoiser, EARLY["batch"], EARLY["length"], EARLY["vocab"], steps=EARLY["steps"],
                             seed=0, execution=Execution(fused=True, sync_every=8, compaction=compaction))
    _runs[("early", compaction)] = result
    return result


def test_early_stop_uncompacted(compare, early_models):
    compare("ddpd_sample", EARLY_SHAPE, "uncompacted", lambda: early_run(early_models, False),
            params="half the rows stop early", rounds=EARLY_ROUNDS)


def test_early_stop_compacted(compare, early_models, capsys):
    compare("ddpd_sample", EARLY_SHAPE, "fused", lambda: early_run(early_models, True),
            params="half the rows stop early", rounds=EARLY_ROUNDS)
    compacted = _runs[("early", True)]
    uncompacted = _runs.get(("early", False)) or early_run(early_models, False)
    assert torch.equal(compacted.tokens, uncompacted.tokens)
    stopped = float((compacted.stop_step < EARLY["steps"]).float().mean())
    rows = compacted.planner_rows + compacted.denoiser_rows
    rows_uncompacted = uncompacted.planner_rows + uncompacted.denoiser_rows
    with capsys.disabled():
        print(f"\n[early stop] {stopped:.0%} of the rows stopped early (median stop step "
              f"{int(compacted.stop_step.float().median())} of {EARLY['steps']}); compaction ran "
              f"{rows / rows_uncompacted:.1%} of the uncompacted run's row-evaluations "
              f"({rows} vs {rows_uncompacted}; saved: planner {compacted.planner_rows_saved}, "
              f"denoiser {compacted.denoiser_rows_saved})")
    assert 0.35 < stopped < 0.65
    assert rows <= 0.6 * rows_uncompacted


END_TO_END = {
    "text8 mask denoiser": dict(vocab=27, length=32, batch=32, steps=32, kind="mask-denoiser",
                                options=dict(denoiser_type="mask", ddpd=DDPDOptions(stop="budget"))),
    "gpt2 uniform denoiser": dict(vocab=50257, length=16, batch=8, steps=12, kind="uniform-denoiser",
                                  options=dict(ddpd=DDPDOptions(stop="budget"))),
}


def shape(name: str) -> tuple:
    """(batch, length, vocabulary) of an end-to-end case."""
    return tuple(END_TO_END[name][field] for field in ("batch", "length", "vocab"))


@pytest.fixture(scope="module")
def end_to_end_models():
    models = {}
    for name, case in END_TO_END.items():
        fields = {f: case[f] for f in ("d_model", "n_layers", "n_heads") if f in case}
        planner = tiny("planner", case["vocab"], case["length"], 2, **fields)
        with torch.no_grad():
            planner.head.weight.mul_(20.0)  # spread the planner's probabilities
        models[name] = (planner, tiny(case["kind"], case["vocab"], case["length"], 3, **fields))
    return models


def end_to_end(models, name, fused):
    case = END_TO_END[name]
    planner, denoiser = models[name]
    with torch.inference_mode():
        result = ddpd_sample(planner, denoiser, case["batch"], case["length"], case["vocab"], steps=case["steps"],
                             seed=1, execution=Execution(fused=fused), **case["options"])
    _runs[(name, fused)] = result
    return result


@pytest.mark.parametrize("name", END_TO_END)
def test_end_to_end_reference(compare, end_to_end_models, name):
    compare("ddpd_sample", shape(name), "reference", lambda: end_to_end(end_to_end_models, name, False),
            params=name, rounds=1)


@pytest.mark.parametrize("name", END_TO_END)
def test_end_to_end_fused(compare, end_to_end_models, name):
    compare("ddpd_sample", shape(name), "fused", lambda: end_to_end(end_to_end_models, name, True),
            params=name, rounds=1)
    reference = _runs.get((name, False)) or end_to_end(end_to_end_models, name, False)
    assert torch.equal(_runs[(name, True)].tokens, reference.tokens)
