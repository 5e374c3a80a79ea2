"""The fused sampling path (fused=True) against the reference samplers.

(a) Same noise, same samples: fed the same noise source, the fused and reference
    paths choose the same positions and tokens, token for token, on oracle toys
    and on tiny random transformers (output head applied at the chosen positions
    through sample_from_hidden, or a plain callable's gathered logits), with one
    tile (V <= 256) and with two (V = 300) in the categorical draw. Sources: Philox
    (uniforms generated inside the ops), a row-keyed source of another type
    (explicit uniforms handed to the ops) and TorchNoise (sequential draws: the
    fused path must ask for the same blocks in the same order).
(b) Own RNG, right law: the fused path under its in-kernel Philox stream against the
    exact law of its chain on oracle toys (B = 50k). Threshold: the 99th percentile
    of TV(law, 50k draws of the law) over 300 repeats, plus 0.005 (oracles/stats.py).
(c) The stop check synchronises once every sync_every steps; argument checks; the
    fused ddpd-sample command line.
"""
import json

import pytest
import torch

from ddpd.checkpoint import save_bundle, save_checkpoint
from ddpd.cli.sample import main
from ddpd.models import config_for
from ddpd.ops.sample_from_hidden import sample_from_hidden
from ddpd.sampling import (
    PhiloxNoise,
    TorchNoise,
    ddpd_sample,
    ddpd_sample_uniform,
    draws,
    maskgit_sample,
    tau_leaping_mask,
    tau_leaping_planned,
    tau_leaping_uniform,
)
from ddpd.sampling.batch import FusedBatch
from ddpd.sampling.options import DDPDOptions, Execution, Temperature
from ddpd.sampling.policies import ErrorBudget
from oracles import laws
from oracles.fixtures import single_thread, tiny_network  # noqa: F401  (single_thread: autouse)
from oracles.stats import empirical, threshold, tv
from oracles.toy import ToyProblem, dirichlet_p_data, sparse_p_data

TOY = ToyProblem(dirichlet_p_data(3, 4, seed=0), 3, 4)
M = TOY.models()


class RowNoise:
    """Row-keyed uniforms that are not a PhiloxNoise: the fused path hands them to the ops explicitly."""

    def __init__(self, seed: int):
        self.inner = PhiloxNoise(seed)

    def uniform(self, step, stream, rows, cols):
        return self.inner.uniform(step, stream, rows, cols)


def assert_same_samples(reference, fused, same_rows=True):
    assert torch.equal(reference.tokens, fused.tokens)
    assert torch.equal(reference.stop_step, fused.stop_step)
    assert reference.steps == fused.steps
    if same_rows:
        assert (reference.planner_rows, reference.denoiser_rows) == (fused.planner_rows, fused.denoiser_rows)
        assert (reference.planner_calls, reference.denoiser_calls) == (fused.planner_calls, fused.denoiser_calls)


# ----------------------------------------------------------------------------- (a) oracle toys

TOY_DDPD = {
    "uniform A": dict(ddpd=DDPDOptions(eps=0.35)),
    "uniform A+C": dict(ddpd=DDPDOptions(selection="softmax", eps=0.35)),
    "uniform B k=3 x3, T 1.3->0": dict(ddpd=DDPDOptions(stop="budget", k=3, parallel_steps=3),
                                       temperature=Temperature(1.3, 0.0)),
    "mask A": dict(denoiser_type="mask", ddpd=DDPDOptions(eps=0.35)),
    "mask B+C k=2 x2": dict(denoiser_type="mask",
                            ddpd=DDPDOptions(selection="softmax", stop="budget", k=2, parallel_steps=2)),
    "mask A k=4 x12, T 0.5": dict(denoiser_type="mask", ddpd=DDPDOptions(eps=0.35, k=4, parallel_steps=12),
                                  temperature=0.5),
    # a temperature per row, from the planner's time estimate (k of them a row)
    "uniform A k=2 x4, T 1.3->0.1": dict(ddpd=DDPDOptions(eps=0.35, k=2, parallel_steps=4),
                                         temperature=Temperature(1.3, 0.1)),
    "mask A, T 1.2->0": dict(denoiser_type="mask", ddpd=DDPDOptions(eps=0.35), temperature=Temperature(1.2, 0.0)),
}


def toy_ddpd(batch, options, **kw):
    denoiser = M.mask_denoiser if options.get("denoiser_type") == "mask" else M.uniform_denoiser
    return ddpd_sample(M.planner, denoiser, batch, 4, 3, steps=12, **options, **kw)


@pytest.mark.parametrize("name", TOY_DDPD)
@pytest.mark.parametrize("source", ["philox", "explicit"])
def test_ddpd_fused_equals_reference_on_oracle_toy(name, source):
    options = TOY_DDPD[name]
    make = (lambda: PhiloxNoise(11)) if source == "philox" else (lambda: RowNoise(11))
    reference = toy_ddpd(300, options, noise=make())
    if options["ddpd"].stop == "eps":
        assert (reference.stop_step < 12).any() and (reference.stop_step == 12).any()
    assert_same_samples(reference, toy_ddpd(300, options, noise=make(), execution=Execution(fused=True, sync_every=1)))
    # Stop checks every 5 steps: the same samples, finished rows evaluated a few more times.
    assert_same_samples(reference, toy_ddpd(300, options, noise=make(), execution=Execution(fused=True, sync_every=5)),
                        same_rows=False)


TOY_EXACT = {
    "exact clock, uniform": lambda **kw: ddpd_sample(M.planner, M.uniform_denoiser, 300, 4, 3, steps=30,
                                                     ddpd=DDPDOptions(clock="exact"), **kw),
    "exact clock, mask, softmax": lambda **kw: ddpd_sample(M.planner, M.mask_denoiser, 300, 4, 3, steps=30,
                                                           ddpd=DDPDOptions(selection="softmax", clock="exact"),
                                                           denoiser_type="mask", **kw),
    "exact clock, time-conditioned planner, T 0.8": lambda **kw: ddpd_sample(M.planner_t, M.uniform_denoiser, 300, 4, 3,
                                                                             steps=30, ddpd=DDPDOptions(clock="exact"),
                                                                             time_conditioned_planner=True,
                                                                             temperature=0.8, **kw),
    "single uniform model A": lambda **kw: ddpd_sample_uniform(M.uniform_model, 300, 4, 3, steps=12,
                                                               ddpd=DDPDOptions(eps=0.35), **kw),
    "single uniform model B+C k=2 x2": lambda **kw: ddpd_sample_uniform(M.uniform_model, 300, 4, 3, steps=12,
                                                                        ddpd=DDPDOptions(selection="softmax",
                                                                                         stop="budget", k=2,
                                                                                         parallel_steps=2), **kw),
    "single uniform model A, one pass": lambda **kw: ddpd_sample_uniform(M.uniform_model, 300, 4, 3, steps=12,
                                                                         ddpd=DDPDOptions(eps=0.35, one_pass=True),
                                                                         **kw),
    "single uniform model, ErrorBudget plan every 2, one pass": lambda **kw: ddpd_sample_uniform(
        M.uniform_model, 300, 4, 3, steps=8, ddpd=DDPDOptions(eps=0.35, one_pass=True, policy=ErrorBudget(
            1.0, 4, known_noise=True, plan_every=2)), **kw),
    "single uniform model, exact clock": lambda **kw: ddpd_sample_uniform(M.uniform_model, 300, 4, 3, steps=30,
                                                                          ddpd=DDPDOptions(clock="exact"), **kw),
    "exact clock, uniform, T 1.2->0.1 over t": lambda **kw: ddpd_sample(M.planner, M.uniform_denoiser, 300, 4, 3,
                                                                        steps=30, ddpd=DDPDOptions(clock="exact"),
                                                                        temperature=Temperature(1.2, 0.1), **kw),
}


@pytest.mark.parametrize("name", TOY_EXACT)
@pytest.mark.parametrize("source", ["philox", "explicit"])
def test_exact_clock_and_single_model_fused_equal_reference(name, source):
    """The exact clock (the fused run denoises every row and keeps the accepted events) and the
    single uniform model (its denoiser is a transform of the model's logits: gathered, then
    sample_categorical) draw what the reference draws."""
    make = (lambda: PhiloxNoise(13)) if source == "philox" else (lambda: RowNoise(13))
    reference = TOY_EXACT[name](noise=make())
    for sync_every in (1, 4):
        fused = TOY_EXACT[name](noise=make(), execution=Execution(fused=True, sync_every=sync_every))
        assert_same_samples(reference, fused, same_rows=False)
    if "exact" in name:  # rows reach t_end at different candidates
        assert (reference.stop_step < 30).any()


@pytest.mark.parametrize("name", ["uniform B k=3 x3, T 1.3->0", "mask B+C k=2 x2"])
def test_ddpd_fused_reads_torch_noise_in_the_reference_order(name):
    """TorchNoise hands out blocks in call order: equal samples mean equal requests."""
    options = TOY_DDPD[name]
    reference = toy_ddpd(200, options, noise=TorchNoise(torch.Generator().manual_seed(4)))
    fused = toy_ddpd(200, options, noise=TorchNoise(torch.Generator().manual_seed(4)),
                     execution=Execution(fused=True))
    assert_same_samples(reference, fused)


BASELINES = {
    "tau mask eta 0": lambda n, **kw: tau_leaping_mask(M.mask_denoiser, n, 4, 3, steps=20, **kw),
    "tau mask eta 2, T 1->0.5": lambda n, **kw: tau_leaping_mask(M.mask_denoiser, n, 4, 3, steps=10, eta=2.0,
                                                                 temperature=Temperature(1.0, 0.5), **kw),
    "tau uniform": lambda n, **kw: tau_leaping_uniform(M.uniform_model, n, 4, 3, steps=10, **kw),
    "tau uniform T 0": lambda n, **kw: tau_leaping_uniform(M.uniform_model, n, 4, 3, steps=6, temperature=0.0, **kw),
    "tau planned uniform": lambda n, **kw: tau_leaping_planned(M.planner, M.uniform_denoiser, n, 4, 3, steps=10,
                                                               **kw),
    "tau planned mask": lambda n, **kw: tau_leaping_planned(M.planner, M.mask_denoiser, n, 4, 3, steps=10,
                                                            denoiser_type="mask", **kw),
    "maskgit": lambda n, **kw: maskgit_sample(M.mask_denoiser, n, 4, 3, steps=4, temperature=0.8, **kw),
    "maskgit T 1 (confidence from the draw)": lambda n, **kw: maskgit_sample(M.mask_denoiser, n, 4, 3, steps=4, **kw),
}


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_fused_equals_reference_on_oracle_toy(name):
    reference = BASELINES[name](300, noise=PhiloxNoise(3))
    fused = BASELINES[name](300, noise=PhiloxNoise(3), execution=Execution(fused=True))
    # The fused baselines run the denoiser on every row of the batch, drawn or not.
    assert_same_samples(reference, fused, same_rows=False)
    assert fused.denoiser_rows >= reference.denoiser_rows
    if name == "tau mask eta 0":
        assert (reference.stop_step < 20).any()


# Rows of the chunked runs (each chunk is a draw of its own: the cost grows with the rows). 41 runs
# every path 300 did: chunks of part of a row, of a row, of two rows ending in a one-row chunk (41
# is odd; 300 rows had that only where tau mask eta 0 compacted its batch), and tau mask eta 0
# compacting its batch (to 19 rows, their ids with gaps).
CHUNK_ROWS = 41


@pytest.mark.parametrize("name", ["tau mask eta 0", "tau uniform", "maskgit"])
@pytest.mark.parametrize("chunk", [7, 13, 30], ids=["parts of a row", "a row", "two rows"])
def test_baseline_draws_in_chunks_are_the_same_draws(name, chunk, monkeypatch):
    """Every position's draw of MaskGIT and tau-leaping: the fused run makes their uniforms in
    chunks of at most TOKEN_CHUNK (3 tokens a draw here: 2, 4 or 10 draws a chunk; all at
    once, a GPT-2-size batch needed ~100 GB)."""
    monkeypatch.setattr(draws, "TOKEN_CHUNK", chunk)
    reference = BASELINES[name](CHUNK_ROWS, noise=PhiloxNoise(3))
    fused = BASELINES[name](CHUNK_ROWS, noise=PhiloxNoise(3), execution=Execution(fused=True))
    assert_same_samples(reference, fused, same_rows=False)


# ----------------------------------------------------------------------------- (a) tiny transformers

def tiny(kind, vocab, length, seed, scale=1.0):
    return tiny_network(kind, vocab, seed, scale, length)


@pytest.fixture(scope="module")
def nets():
    out = {}
    for vocab in (27, 300):
        out[vocab] = dict(planner=tiny("planner", vocab, 8, 0, scale=40.0),
                          uniform=tiny("uniform-denoiser", vocab, 8, 1, scale=20.0),
                          mask=tiny("mask-denoiser", vocab, 8, 2, scale=20.0))
    return out


NET_CASES = [
    ("uniform A", 27, dict(ddpd=DDPDOptions(eps=0.2))),
    ("mask A+C", 27, dict(denoiser_type="mask", ddpd=DDPDOptions(selection="softmax", eps=0.2))),
    ("mask B k=3 x2, T 0.7->0.2", 27, dict(denoiser_type="mask",
                                           ddpd=DDPDOptions(stop="budget", k=3, parallel_steps=2),
                                           temperature=Temperature(0.7, 0.2))),
    ("uniform B k=2 x3, two tiles", 300, dict(ddpd=DDPDOptions(stop="budget", k=2, parallel_steps=3))),
    ("mask A, two tiles", 300, dict(denoiser_type="mask", ddpd=DDPDOptions(eps=0.2))),
    ("uniform A k=2 x3, T 1.2->0.3, two tiles", 300, dict(ddpd=DDPDOptions(eps=0.2, k=2, parallel_steps=3),
                                                          temperature=Temperature(1.2, 0.3))),
]


@pytest.mark.parametrize("head", ["hidden+head", "callable"])
@pytest.mark.parametrize("name,vocab,options", NET_CASES, ids=[c[0] for c in NET_CASES])
def test_ddpd_fused_equals_reference_on_tiny_transformers(nets, monkeypatch, name, vocab, options, head):
    models = nets[vocab]
    denoiser = models[options.get("denoiser_type", "uniform")]
    fused_denoiser = denoiser if head == "hidden+head" else (lambda x, t: denoiser(x, t))
    head_rows = []

    def recorded(hidden, *args, **kw):
        head_rows.append(hidden.shape[0])
        return sample_from_hidden(hidden, *args, **kw)

    monkeypatch.setattr(draws, "sample_from_hidden", recorded)
    with torch.inference_mode():
        reference = ddpd_sample(models["planner"], denoiser, 64, 8, vocab, steps=16, seed=9, **options)
        fused = ddpd_sample(models["planner"], fused_denoiser, 64, 8, vocab, steps=16, seed=9,
                            execution=Execution(fused=True, sync_every=1), **options)
    if options["ddpd"].stop == "eps":
        assert (reference.stop_step < 16).any() and (reference.stop_step == 16).any()
    assert_same_samples(reference, fused)
    if head == "hidden+head":  # the head ran at the k chosen positions of each running row, nowhere else
        k, parallel = options["ddpd"].k, options["ddpd"].parallel_steps
        running = [int((reference.stop_step > i).sum()) for i in range(fused.denoiser_calls)]
        assert head_rows == [n * (k if i < parallel else 1) for i, n in enumerate(running)]
    else:
        assert head_rows == []


# ----------------------------------------------------------------------------- (b) own RNG, exact law

B = 50_000
LAW_CASES = [
    ("uniform A", "dir S3 D3", 10, dict(ddpd=DDPDOptions(stop="eps", eps=0.3))),
    ("uniform B+C k=2 x2, T 1.2->0.6", "dir S3 D3", 6,
     dict(ddpd=DDPDOptions(selection="softmax", stop="budget", k=2, parallel_steps=2),
          temperature=Temperature(1.2, 0.6))),
    ("mask A", "dir S3 D3", 8, dict(ddpd=DDPDOptions(stop="eps", eps=0.3), denoiser_type="mask")),
    ("mask B k=3 x1", "sparse S2 D4", 5, dict(ddpd=DDPDOptions(stop="budget", k=3, parallel_steps=1),
                                              denoiser_type="mask")),
]
LAW_TOYS = {"dir S3 D3": lambda: ToyProblem(dirichlet_p_data(3, 3, seed=1), 3, 3),
            "sparse S2 D4": lambda: ToyProblem(sparse_p_data(2, 4, support=5, seed=2), 2, 4)}


@pytest.mark.parametrize("name,toy_name,steps,options", LAW_CASES, ids=[c[0] for c in LAW_CASES])
def test_ddpd_fused_matches_its_exact_law(name, toy_name, steps, options):
    problem = LAW_TOYS[toy_name]()
    models = problem.models()
    denoiser = models.mask_denoiser if options.get("denoiser_type") == "mask" else models.uniform_denoiser
    result = ddpd_sample(models.planner, denoiser, B, problem.D, problem.S, steps=steps, seed=2024,
                         execution=Execution(fused=True), **options)
    law = laws.ddpd_planner_clock_law(problem, steps, **options)
    distance, limit = tv(empirical(problem.index(result.tokens), problem.N), law), threshold(law, B)
    assert distance < limit, f"{name}: TV to its exact law {distance:.4f} >= {limit:.4f}"


def test_a_wrong_fused_draw_is_caught():
    """The law test has power: a denoiser at the wrong temperature fails it."""
    problem = LAW_TOYS["dir S3 D3"]()
    models = problem.models()
    hot = lambda x, t: models.uniform_denoiser(x, t) * 0.5  # noqa: E731
    result = ddpd_sample(models.planner, hot, B, 3, 3, steps=6, ddpd=DDPDOptions(stop="budget"), seed=1,
                         execution=Execution(fused=True))
    law = laws.ddpd_planner_clock_law(problem, 6, ddpd=DDPDOptions(stop="budget"))
    assert tv(empirical(problem.index(result.tokens), problem.N), law) > threshold(law, B)


def test_fused_tau_leaping_matches_its_exact_law():
    problem = LAW_TOYS["dir S3 D3"]()
    result = tau_leaping_mask(problem.models().mask_denoiser, B, 3, 3, steps=10, eta=1.0, seed=5,
                              execution=Execution(fused=True))
    law = laws.tau_leaping_mask_law(problem, 10, eta=1.0)
    assert tv(empirical(problem.index(result.tokens), problem.N), law) < threshold(law, B)


# ----------------------------------------------------------------------------- (c) synchronisation, arguments, CLI

@pytest.mark.parametrize("sync_every", [1, 3, 7])
def test_stop_check_syncs_once_every_sync_every_steps(monkeypatch, sync_every):
    checks = []
    original = FusedBatch._check

    def counted(self, carried):
        checks.append(self.running_rows)
        return original(self, carried)

    monkeypatch.setattr(FusedBatch, "_check", counted)
    never_stops = lambda x: torch.full(x.shape, 3.0)  # noqa: E731
    result = ddpd_sample(never_stops, M.uniform_denoiser, 5, 4, 3, steps=21, seed=0,
                         execution=Execution(fused=True, sync_every=sync_every))
    assert len(checks) == 21 // sync_every and result.planner_calls == 21
    checks.clear()
    ddpd_sample(never_stops, M.uniform_denoiser, 5, 4, 3, steps=21, seed=0,
                execution=Execution(fused=True, sync_every=sync_every), ddpd=DDPDOptions(stop="budget"))
    assert checks == []  # option B never looks at the stop flags


@pytest.mark.parametrize("mode,calls", [(0, []), (2, [0, 2])], ids=["off", "error"])
def test_the_stop_check_sets_the_sync_debug_mode_only_where_it_is_on(monkeypatch, mode, calls):
    """Setting torch's sync debug mode warns once a process that it is a prototype: where the
    mode is off the check leaves it alone; where it is on, turns it off for its one sync and
    back on after."""
    from ddpd.sampling import batch

    set_to = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_to.append)
    with batch._sync_allowed():
        assert set_to == calls[:1]
    assert set_to == calls


def _ddpd(**execution):
    return ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, seed=0,
                       execution=Execution(**{"fused": True, **execution}))


@pytest.mark.parametrize("call,error,match", [
    (lambda: ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, ddpd=DDPDOptions(eps=1.0)), ValueError,
     "eps"),
    (lambda: _ddpd(sync_every=0), ValueError, "sync_every"),
    (lambda: _ddpd(sync_every=2.0), TypeError, "sync_every"),
    (lambda: _ddpd(fused="yes"), TypeError, "fused"),
    (lambda: _ddpd(compaction=1), TypeError, "compaction"),
    (lambda: tau_leaping_mask(M.mask_denoiser, 2, 4, 3, steps=3,
                              execution=Execution(fused=True, sync_every=-1)), ValueError,
     "sync_every"),
    (lambda: maskgit_sample(M.mask_denoiser, 2, 4, 3, steps=3, execution=Execution(fused=None)), TypeError, "fused"),
])
def test_bad_fused_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_hidden_head_of_the_wrong_width_is_reported(nets):
    with pytest.raises(ValueError, match="head"):
        ddpd_sample(nets[27]["planner"], nets[300]["uniform"], 2, 8, 27, steps=2, seed=0,
                    execution=Execution(fused=True))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused_cli")
    configs = {}
    for kind in ("planner", "mask-denoiser"):
        config = config_for(kind, 27, 8, d_model=16, n_layers=1, n_heads=2)
        configs[kind] = {"kind": kind, "model": config.to_dict(), "tokenizer": {"name": "text8"},
                         "schedule": "linear"}
    planner, denoiser = tiny("planner", 27, 8, 0, scale=40.0), tiny("mask-denoiser", 27, 8, 2)
    save_bundle(str(root / "bundle"), planner, configs["planner"], denoiser, configs["mask-denoiser"])
    save_checkpoint(str(root / "mask"), denoiser, configs["mask-denoiser"])
    return root


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return err


@pytest.mark.parametrize("argv", [
    ["--checkpoint", "bundle", "--eps", "0.2", "--steps", "16"],
    ["--checkpoint", "bundle", "--option", "A+B+C", "--k", "2", "--parallel-steps", "2"],
    ["--checkpoint", "mask", "--sampler", "tau-leaping", "--steps", "12"],
    ["--checkpoint", "mask", "--sampler", "maskgit", "--steps", "4"],
])
def test_cli_fused_prints_the_reference_samples_and_statistics(bundle, tmp_path, capsys, argv):
    argv = [str(bundle / a) if a in ("bundle", "mask") else a for a in argv]
    samples = {}
    for flag in ([], ["--fused", "--sync-every", "3"]):
        out = tmp_path / f"s{len(flag)}.jsonl"
        err = _cli(capsys, *argv, "--num-samples", "10", "--batch-size", "4", "--seed", "5", "--quiet",
                   "--out", str(out), *flag)
        assert "samples/s" in err and "row-evaluations" in err and "saved by early stopping" in err
        with open(out, encoding="utf-8") as f:
            samples[bool(flag)] = [(r["tokens"], r["stop_step"]) for r in map(json.loads, f)]
    assert samples[True] == samples[False]


def test_cli_fused_runs_the_single_uniform_model(tmp_path, capsys):
    """ddpd with one uniform model has a fused run too (every sampler does): same samples."""
    config = config_for("uniform", 27, 8, d_model=16, n_layers=1, n_heads=2)
    save_checkpoint(str(tmp_path / "u"), tiny("uniform", 27, 8, 3),
                    {"kind": "uniform", "model": config.to_dict(), "tokenizer": {"name": "text8"}})
    samples = []
    for flag in ([], ["--fused"]):
        out = tmp_path / f"s{len(flag)}.jsonl"
        _cli(capsys, "--checkpoint", str(tmp_path / "u"), "--steps", "6", "--quiet", "--out", str(out), *flag)
        with open(out, encoding="utf-8") as f:
            samples.append([r["tokens"] for r in map(json.loads, f)])
    assert samples[0] == samples[1]
