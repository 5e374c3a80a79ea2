"""Noise sources, options, time estimates and the two Draws strategies of ddpd.sampling; determinism,
bookkeeping, argument checks.
"""

import argparse
import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from ddpd.ops.rng import philox_uniform
from ddpd.ops.sample_categorical import TILE, noise_width
from ddpd.process import CosineSchedule, LinearSchedule
from ddpd.sampling import (
    DDPDOptions,
    Execution,
    PhiloxNoise,
    Temperature,
    TorchNoise,
    common,
    ddpd_sample,
    ddpd_sample_uniform,
    maskgit_sample,
    tau_leaping_mask,
    tau_leaping_planned,
    tau_leaping_uniform,
)
from ddpd.sampling.common import Run, run_steps, setup, write
from ddpd.sampling.draws import FusedDraws, ReferenceDraws
from ddpd.sampling.gillespie import mask_time, planner_time
from ddpd.sampling.noise import (
    NUM_STREAMS,
    SELECT,
    CheckedNoise,
    exponential,
    gumbel,
    happens,
    make_noise,
    stream_offset,
)
from ddpd.sampling.options import Guidance, Truncation, check_option
from ddpd.sampling.policies import ErrorBudget
from oracles.fixtures import single_thread  # noqa: F401  (autouse)
from oracles.toy import ToyProblem, dirichlet_p_data

# ----------------------------------------------------------------------------- noise


def test_philox_noise_is_the_rng_stream_at_step_offsets():
    rows = torch.tensor([5, 2, 9])
    u = PhiloxNoise(seed=11, offset=3).uniform(4, SELECT, rows, 6)
    assert torch.equal(u, philox_uniform(11, 3 + 4 * NUM_STREAMS + SELECT, rows, 6))


def test_philox_noise_rows_keep_their_stream():
    noise = PhiloxNoise(seed=1)
    full = noise.uniform(2, SELECT, torch.arange(10), 4)
    assert torch.equal(noise.uniform(2, SELECT, torch.tensor([7, 3]), 4), full[[7, 3]])


def test_philox_noise_first_row_shifts_the_row_ids():
    shifted = PhiloxNoise(seed=4, first_row=5).uniform(3, SELECT, torch.arange(3), 7)
    assert torch.equal(shifted, PhiloxNoise(seed=4).uniform(3, SELECT, torch.arange(5, 8), 7))


def test_philox_noise_columns_are_a_slice_of_the_uniform_row():
    """columns(first, count) are columns first .. first + count - 1 of uniform, as chunked token draws read them."""
    noise, rows = PhiloxNoise(seed=4, first_row=2), torch.arange(3)
    assert torch.equal(noise.columns(3, SELECT, rows, 4, 5), noise.uniform(3, SELECT, rows, 9)[:, 4:])


def test_a_first_row_is_any_integer_in_range_and_the_rest_are_named():
    """np.int64(5) was refused as "not an int", though the seed beside it takes numpy's integers."""
    rows = torch.arange(3)
    noise = PhiloxNoise(4, first_row=np.int64(5))
    assert type(noise.first_row) is int
    assert torch.equal(noise.uniform(3, SELECT, rows, 7), PhiloxNoise(4, first_row=5).uniform(3, SELECT, rows, 7))
    for bad in (-1, 2**62, 1.0, True, "5"):
        message = f"first_row must be an int in [0, 2**62), got {bad!r}"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            PhiloxNoise(4, first_row=bad)


def test_noise_reprs_name_their_fields_and_a_generator_must_be_one():
    noise = PhiloxNoise(7, 2**64 - 1, first_row=3)
    assert repr(noise) == f"PhiloxNoise(seed=7, offset={2**64 - 1}, first_row=3)"
    again = eval(repr(noise), {"PhiloxNoise": PhiloxNoise})
    assert torch.equal(again.uniform(2, SELECT, torch.arange(4), 5), noise.uniform(2, SELECT, torch.arange(4), 5))
    with pytest.raises(TypeError, match="^generator must be a torch.Generator or None, got int$"):
        TorchNoise(3)


def test_row_ids_are_64_bit_end_to_end():
    """Rows 2**32 apart draw differently (only the low 32 bits entered Philox once)."""
    low = PhiloxNoise(0).uniform(3, SELECT, torch.arange(4), 16)
    high = PhiloxNoise(0, first_row=2**32).uniform(3, SELECT, torch.arange(4), 16)
    assert not torch.equal(low, high)
    assert not torch.equal(PhiloxNoise(0, first_row=2**32 - 1).uniform(0, SELECT, torch.arange(2), 8)[1],
                           PhiloxNoise(0).uniform(0, SELECT, torch.arange(1), 8)[0])
    runs = [ddpd_sample(M.planner, M.uniform_denoiser, 30, 4, 3, steps=4, ddpd=DDPDOptions(stop="budget"),
                        execution=Execution(fused=fused),
                        noise=PhiloxNoise(1, first_row=first)) for first in (0, 2**40) for fused in (False, True)]
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[2].tokens, runs[3].tokens)
    assert not torch.equal(runs[0].tokens, runs[2].tokens)


def test_torch_noise_is_on_the_open_grid():
    u = TorchNoise(torch.Generator().manual_seed(0)).uniform(0, 0, torch.arange(1000), 100)
    assert (u > 0).all() and (u < 1).all()
    assert float(u.min()) < 0.001 and float(u.max()) > 0.999  # the whole grid, not a part of it
    assert torch.equal(u, ((u * 2**24 - 0.5).round() + 0.5) * 2**-24)


def test_a_step_tensor_gives_the_offset_an_int_step_gives():
    """A replayed step's offset is an int64 tensor (the bits of the uint64): the int step's
    offset at every base, the top half of the range included, and with the stream added."""
    for base in (0, 5, 2**63 - 1, 2**63, 2**64 - 3):
        for step, stream in ((0, SELECT), (3, NUM_STREAMS - 1)):
            offset = stream_offset(base, torch.tensor(step), stream)
            assert offset.dtype == torch.int64
            expected = (base + step * NUM_STREAMS + stream) % 2**64
            assert int(offset) % 2**64 == stream_offset(base, step, stream) == expected


def test_transforms_stay_finite_at_the_ends_of_the_grid():
    # float32 rounds the top grid value of philox_uniform to 1.0
    u = torch.tensor([2**-25, 0.5, 1.0], dtype=torch.float32)
    assert torch.isfinite(gumbel(u)).all() and torch.isfinite(exponential(u)).all()


def test_make_noise_arguments():
    seeded = make_noise(seed=3)  # PhiloxNoise(seed): a sampler's seed=3 draws what noise=PhiloxNoise(3) draws
    assert isinstance(seeded, PhiloxNoise) and (seeded.seed, seeded.offset, seeded.first_row) == (3, 0, 0)
    for own in (PhiloxNoise(3), TorchNoise()):  # ddpd's own sources, used as given (Philox: drawn in the kernels)
        assert make_noise(noise=own) is own
    g = torch.Generator().manual_seed(0)
    a, b = make_noise(generator=g), make_noise(generator=torch.Generator().manual_seed(0))
    assert (a.seed, a.offset) == (b.seed, b.offset)
    with pytest.raises(ValueError, match="at most one"):
        make_noise(seed=1, generator=g)
    with pytest.raises(TypeError, match="generator"):
        make_noise(generator=3)
    with pytest.raises(TypeError, match="noise"):
        make_noise(noise=object())
    message = "noise must have a uniform(step, stream, rows, cols) method, got Namespace"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        make_noise(noise=argparse.Namespace(uniform=0.5))  # an attribute, not a method
    with pytest.raises(ValueError, match="seed"):
        make_noise(seed=-1)


def test_make_noise_wraps_a_callers_source_once():
    """A caller's own source is checked at each call through one CheckedNoise; a source already
    checked is used as given, not wrapped again."""
    own = argparse.Namespace(uniform=lambda step, stream, rows, cols: torch.full((rows.numel(), cols), 0.5))
    checked = make_noise(noise=own)
    assert type(checked) is CheckedNoise and checked.source is own
    assert make_noise(noise=checked) is checked
    assert torch.equal(checked.uniform(0, SELECT, torch.arange(2), 3), torch.full((2, 3), 0.5))


def test_numpy_integer_seeds_draw_what_ints_draw():
    """np.int64(3) was refused with a ValueError naming it; offsets add in Python ints, mod 2**64."""
    rows = torch.arange(3)
    for seed, offset in ((3, 0), (2**64 - 1, 2**64 - 5)):
        noise = PhiloxNoise(np.uint64(seed), np.uint64(offset))
        assert (type(noise.seed), type(noise.offset)) == (int, int)
        assert torch.equal(noise.uniform(5, SELECT, rows, 4), PhiloxNoise(seed, offset).uniform(5, SELECT, rows, 4))
    assert make_noise(seed=np.int64(3)).seed == 3
    with pytest.raises(TypeError, match="seed must be an int, got float 3.0"):
        make_noise(seed=3.0)


def test_a_sampler_takes_a_numpy_integer_seed():
    def run(seed):
        return ddpd_sample(M.planner, M.uniform_denoiser, 30, 4, 3, steps=4, seed=seed).tokens

    assert torch.equal(run(np.int64(3)), run(3))


# ----------------------------------------------------------------------------- options, time, writes, draws


def test_temperature_schedule():
    t = Temperature(1.0, 0.0)
    assert [t.at(i, 5) for i in (0, 2, 4)] == [1.0, 0.5, 0.0]
    assert Temperature(0.7, 0.1).at(0, 1) == 0.7 and Temperature(0.7).end == 0.7
    assert [Temperature(0.7, 0.1).at(i, 2) for i in range(2)] == [0.7, 0.1]  # two steps: both ends
    # the last step ends at the end, never past it (1.7 to 0 in 42 steps used to end at -2.2e-16)
    for start, end, steps in ((1.7, 0.0, 42), (1.7, 0.0, 155), (0.7, 0.0, 188), (0.1, 1.3, 77), (1.17, 0.0, 31),
                              (0.1, 0.0, 44)):  # past the end, or short of it (1.17: 2.2e-16, not greedy)
        schedule = [Temperature(start, end).at(i, steps) for i in range(steps)]
        assert schedule[-1] == end and all(min(start, end) <= v <= max(start, end) for v in schedule)
    assert ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=42, temperature=Temperature(1.7, 0.0),
                       seed=0).tokens.shape == (2, 4)
    settings = dict(temperature=1.0, schedule="linear", seed=0, generator=None, noise=None, device=None, prompt=None,
                    guidance=None, truncation=Truncation(), execution=Execution())
    assert setup("ddpd_sample", 2, 4, 3, steps=2**61, **settings)[0].steps == 2**61
    with pytest.raises(ValueError, match=r"steps must be in \[1, 2305843009213693952\]"):  # a wider bound fails here
        setup("ddpd_sample", 2, 4, 3, steps=2**61 + 1, **settings)
    with pytest.raises(ValueError, match=r"steps must be in \[1, 2305843009213693952\]"):  # not after the run
        ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=2**61 + 1, seed=0)
    with pytest.raises(ValueError, match=r"vocab_size must be <= 8388608 for tokens drawn uniformly"):  # x_0
        ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 2**23 + 1, steps=2, seed=0)
    huge = 2**23 + 1  # a sampler that starts from masks draws no uniform token: no bound
    # (its one draw over 2**23 + 1 tokens reads as many uniforms: TorchNoise makes them at once,
    # PhiloxNoise in some 15 s of torch on a CPU)
    torch_noise = TorchNoise(torch.Generator().manual_seed(0))
    assert maskgit_sample(lambda x, t: torch.zeros(*x.shape, huge), 1, 1, huge, steps=1,
                          noise=torch_noise).tokens.shape == (1, 1)
    for too_hot in (float("inf"), 1e37):
        with pytest.raises(ValueError, match=r"temperature must be in \[0.0, 1e\+36\]"):
            Temperature(too_hot)
    with pytest.raises(ValueError, match="temperature_end"):
        Temperature(1.0, -0.5)


def test_each_step_runs_at_its_own_temperature():
    """run_steps hands step i the schedule's temperature at i, and marks only the last step as last."""
    run, draws = setup("ddpd_sample", 2, 4, 3, steps=5, temperature=Temperature(1.0, 0.0), schedule="linear", seed=0,
                       generator=None, noise=None, device=None, prompt=None, guidance=None, truncation=Truncation(),
                       execution=Execution())
    seen = []
    record = lambda i, temperature, last, check: seen.append((i, temperature, last))  # noqa: E731
    run_steps(run, draws, common.start(run, draws), record, stops=False)
    assert seen == [(0, 1.0, False), (1, 0.75, False), (2, 0.5, False), (3, 0.25, False), (4, 0.0, True)]


def test_a_plain_number_temperature_is_the_fixed_temperature():
    """setup takes what Temperature(...) takes: an int 1 runs at Temperature(1.0)."""
    def run(temperature):
        return maskgit_sample(M.mask_denoiser, 3, 4, 3, steps=3, temperature=temperature, seed=2).tokens

    assert torch.equal(run(1), run(Temperature(1.0))) and torch.equal(run(0), run(Temperature(0.0)))


def test_temperature_over_a_runs_time():
    t = Temperature(1.0, 0.2)
    value = t.over(torch.tensor([0.0, 0.5, 1.0, 1.7, -0.1]))
    assert torch.equal(value[[0, 2, 3, 4]], torch.tensor([1.0, 0.2, 0.2, 1.0])) and abs(float(value[1]) - 0.6) < 1e-6
    fixed = Temperature(0.7).over(torch.tensor([0.3]))
    assert type(fixed) is float and fixed == 0.7  # fixed: a number (the ops' scalar path)
    # the end exactly at the final time, as `at` is at the last step (float32 arithmetic gave 0.80000007)
    assert torch.equal(Temperature(1.44, 0.8).over(torch.tensor([1.0])), torch.tensor([0.8]))


def test_temperature_over_stays_within_its_ends_just_before_the_final_time():
    """Float32 arithmetic took 0.6 -> 0.7 to 0.70000005 at the last fraction below 1: the value is
    held within [start, end], so a run never draws at a temperature past the end it asked for."""
    value = Temperature(0.6, 0.7).over(torch.tensor([1.0 - 2**-24, 0.0]))
    assert torch.equal(value, torch.tensor([0.7, 0.6]))


def draw_temperatures(monkeypatch):
    """The temperature of every token draw of the reference runs (a list of Float[N] per step)."""
    seen = []
    categorical = ReferenceDraws.categorical

    def recorded(self, step, rows, logits, per_row, temperature, *args, **kwargs):
        seen.append(torch.as_tensor(temperature, dtype=torch.float32).expand(logits.shape[0]).clone())
        return categorical(self, step, rows, logits, per_row, temperature, *args, **kwargs)

    monkeypatch.setattr(ReferenceDraws, "categorical", recorded)
    return seen


def test_an_annealed_temperature_on_the_exact_clock_reaches_its_end_at_t_end(monkeypatch):
    """The exact clock ends at t_end, here after about 50 of a budget of 480 steps: annealed over the
    steps, Temperature(1.0, 0.0) ended near 0.9 there. Over the clock's time the last draws are near 0
    (within the last jump's share of the time). The eps stop follows the planner's time estimate,
    held to its exact law in test_sampling_ddpd.py."""
    seen = draw_temperatures(monkeypatch)
    result = ddpd_sample(M.planner_t, M.uniform_denoiser, 200, 4, 3, steps=480, temperature=Temperature(1.0, 0.0),
                         ddpd=DDPDOptions(clock="exact"), time_conditioned_planner=True, seed=3)
    assert int(result.stop_step.max()) < 100
    assert float(seen[0].mean()) > 0.6 and float(torch.cat(seen[-3:]).max()) < 0.1


def test_options_are_validated_once_and_frozen():
    opts = DDPDOptions(selection="softmax", eps=0.05)
    assert opts.stop == "eps" and DDPDOptions(clock="exact").stop == "budget"
    with pytest.raises(Exception):
        opts.eps = 0.5  # frozen
    assert [opts.positions_at(i) for i in range(3)] == [1, 1, 1]
    assert [DDPDOptions(k=3, parallel_steps=2).positions_at(i) for i in range(3)] == [3, 3, 1]
    with pytest.raises(ValueError, match="k"):
        DDPDOptions(k=5, parallel_steps=1).check(length=4, steps=3)
    with pytest.raises(ValueError, match="sync_every"):
        Execution(sync_every=0)


def test_execution_defaults_are_the_documented_ones():
    """docs/api.md: on CUDA the networks run in bfloat16 by default (dtype="auto") and the fused
    steps replay from CUDA graphs (graphs="auto"); on the CPU neither shows in the samples."""
    assert dataclasses.asdict(Execution()) == dict(fused=False, sync_every=8, compaction=True, dtype="auto",
                                                   graphs="auto")


def test_numpy_numbers_in_options_are_stored_as_python_numbers():
    """An option given a numpy scalar (a value read from an array) holds the Python int or float:
    what JSON writes and torch's int arguments take."""
    ddpd = DDPDOptions(eps=np.float32(0.25), k=np.int64(2), parallel_steps=np.int32(1))
    clock = DDPDOptions(clock="exact", t_end=np.float32(0.5))
    execution = Execution(sync_every=np.int64(3))
    guidance = Guidance(torch.zeros(2, dtype=torch.long), scale=np.float32(1.5))
    temperature = Temperature(np.float32(0.5), np.float32(0.25))
    values = [ddpd.eps, ddpd.k, ddpd.parallel_steps, clock.t_end, execution.sync_every, guidance.scale,
              temperature.start, temperature.end]
    assert [type(value) for value in values] == [float, int, int, float, int, float, float, float]
    assert values == [0.25, 2, 1, 0.5, 3, 1.5, 0.5, 0.25]
    json.dumps([dataclasses.asdict(ddpd), dataclasses.asdict(clock), dataclasses.asdict(execution)])


def test_ddpd_options_check_takes_k_and_parallel_steps_up_to_the_runs_shape():
    """k may be the whole sequence and parallel_steps the whole budget; one more is refused."""
    opts = DDPDOptions(k=4, parallel_steps=3)
    assert opts.check(length=4, steps=3) is opts
    with pytest.raises(ValueError, match=r"k must be in \[1, 3\], got 4"):
        opts.check(length=3, steps=3)
    with pytest.raises(ValueError, match=r"parallel_steps must be in \[0, 2\], got 3"):
        opts.check(length=4, steps=2)


@pytest.mark.parametrize("fields,error,match", [
    (dict(fused=1), TypeError, "fused must be a bool, got int 1"),
    (dict(compaction="yes"), TypeError, "compaction must be a bool, got str 'yes'"),
    (dict(dtype="float64"), ValueError, r"dtype must be one of \('auto', 'float32', 'bfloat16', 'float16'\)"),
    (dict(graphs="on"), ValueError, r"graphs must be one of \('auto', 'off', 'emulate'\), got 'on'"),
    (dict(dtype=torch.float64), ValueError, r"dtype must be one of \(torch.float32, torch.bfloat16, torch.float16\)"),
    (dict(dtype=torch.int64), ValueError, r"dtype must be one of \(torch.float32, torch.bfloat16, torch.float16\)"),
])
def test_execution_refuses_each_bad_field(fields, error, match):
    with pytest.raises(error, match=match):
        Execution(**fields)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_execution_takes_a_torch_dtype_as_its_name(dtype):
    """As prepare_for_sampling takes it: Execution(dtype=torch.bfloat16) is Execution(dtype="bfloat16")."""
    name = str(dtype).removeprefix("torch.")
    assert Execution(dtype=dtype) == Execution(dtype=name) and Execution(dtype=dtype).dtype == name


@pytest.mark.parametrize("fields,error,match", [
    (dict(eps=1.0), ValueError, r"eps must be in \(0.0, 1.0\), got 1.0"),
    (dict(clock="exact", t_end=0.0), ValueError, r"t_end must be in \(0.0, 1.0\), got 0.0"),
    (dict(k=0), ValueError, "k must be >= 1, got 0"),
    (dict(parallel_steps=-1), ValueError, "parallel_steps must be >= 0, got -1"),
    (dict(k=2), ValueError, "k=2 acts in the parallel stage only"),
    (dict(parallel_steps=1), ValueError, "parallel_steps=1 is a stage of k positions a step"),
    (dict(policy="error-budget"), TypeError, "policy must be an ErrorBudget .*, got str"),
    (dict(k=2, parallel_steps=1, policy=ErrorBudget()), ValueError, "policy needs parallel_steps=0"),
], ids=["eps=1", "t_end=0", "k=0", "parallel_steps=-1", "k=2 alone", "parallel_steps=1 alone", "policy str",
        "policy with a stage"])
def test_ddpd_options_refuse_each_field_at_its_bound(fields, error, match):
    with pytest.raises(error, match=match):
        DDPDOptions(**fields)


@pytest.mark.parametrize("call,match", [
    (lambda: ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, selction="softmax"), "selction"),
    (lambda: ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, eps=0.1), "eps"),
    (lambda: ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, ddpd={"eps": 0.1}),
     "ddpd must be a DDPDOptions"),
    (lambda: tau_leaping_mask(M.mask_denoiser, 2, 4, 3, steps=3, execution={"fused": True}),
     "execution must be an Execution"),
    (lambda: maskgit_sample(M.mask_denoiser, 2, 4, 3, steps=3, truncation=0.9), "truncation must be a Truncation"),
    (lambda: ddpd_sample_uniform(M.uniform_model, 2, 4, 3, steps=3, prompt=torch.zeros(2, 4, dtype=torch.long)),
     "prompt must be a Prompt"),
    (lambda: tau_leaping_uniform(M.uniform_model, 2, 4, 3, steps=3, guidance=torch.zeros(2, dtype=torch.long)),
     "guidance must be a Guidance"),
    (lambda: tau_leaping_uniform(M.uniform_model, 2, 4, 3, steps=3, mask_id=3), "mask_id"),
    (lambda: ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, temperature_end=0.5), "temperature_end"),
    (lambda: ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, fused=True), "fused"),
])
def test_unknown_options_and_wrong_objects_are_type_errors(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_a_moved_keyword_names_other_samplers_where_this_one_takes_no_such_option():
    """eps now lives in DDPDOptions, which maskgit_sample does not take: the hint says so rather
    than sending the caller to a ddpd= that would fail again; fused points to execution=."""
    message = ("eps (ddpd=DDPDOptions(eps=...) of other samplers; maskgit_sample takes no ddpd=), "
               "fused (now execution=Execution(fused=...))")
    with pytest.raises(TypeError, match=re.escape(message)):
        maskgit_sample(M.mask_denoiser, 2, 4, 3, steps=3, eps=0.1, fused=True)


@pytest.mark.parametrize("sampler", [ddpd_sample, tau_leaping_planned])
def test_a_mask_id_without_a_mask_denoiser_is_refused(sampler):
    with pytest.raises(ValueError, match="mask_id is read with a mask denoiser only"):
        sampler(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, mask_id=7)
    sampler(M.planner, M.mask_denoiser, 2, 4, 3, steps=3, mask_id=3, denoiser_type="mask", seed=0)


@pytest.mark.parametrize("sampler", ["tau mask", "maskgit", "ddpd mask k=2"])
def test_a_mask_id_inside_the_vocabulary_is_refused(sampler):
    """A mask id below vocab_size would be a real token: the all-mask start would be data."""
    with pytest.raises(ValueError, match="mask_id must be >= 3, got 2"):
        SAMPLERS[sampler](2, seed=0, mask_id=2)
    assert SAMPLERS[sampler](2, seed=0, mask_id=3).tokens.max() < 3


def test_a_mask_run_starts_from_its_own_mask_id():
    """A mask id past vocab_size is the token of the all-mask start, not vocab_size."""
    first = []

    def denoiser(x, t):
        first.append(x.clone())
        return torch.zeros(*x.shape, 3)

    tokens = maskgit_sample(denoiser, 2, 4, 3, steps=2, seed=0, mask_id=5).tokens
    assert torch.equal(first[0], torch.full((2, 4), 5)) and tokens.max() < 3
    start = common.start(*setup("s", 2, 4, 3, steps=2, temperature=1.0, schedule="linear", seed=0, generator=None,
                                noise=None, device=None, prompt=None, guidance=None, truncation=Truncation(),
                                execution=Execution(), mask_id=5, masks=True), masks=True)
    assert torch.equal(start.x, torch.full((2, 4), 5))


def test_a_uniform_start_draws_row_b_from_row_id_b_at_step_0():
    """x_0 of row b is the INIT stream's draw at step 0 for row id b (row ids count from the
    noise source's first_row), whatever the batch size."""
    from ddpd.process import uniform_token
    from ddpd.sampling.noise import INIT

    noise = PhiloxNoise(7, first_row=3)
    run, draws = setup("s", 5, 6, 11, steps=2, temperature=1.0, schedule="linear", seed=None, generator=None,
                       noise=noise, device=None, prompt=None, guidance=None, truncation=Truncation(),
                       execution=Execution())
    expected = uniform_token(noise.uniform(0, INIT, torch.arange(5), 6), 11)
    assert torch.equal(common.start(run, draws).x, expected)
    assert torch.equal(uniform_token(PhiloxNoise(7).uniform(0, INIT, torch.arange(3, 8), 6), 11), expected)


def test_time_estimates():
    run = Run(1, 4, 3, 1, Temperature(), LinearSchedule(), None, PhiloxNoise(0), None)
    assert torch.allclose(planner_time(torch.tensor([0.8]), run), torch.tensor([0.8]))
    assert torch.allclose(mask_time(torch.tensor([1]), run), torch.tensor([0.75]))
    cosine = Run(1, 4, 3, 1, Temperature(), CosineSchedule(), None, PhiloxNoise(0), None)
    assert torch.allclose(cosine.schedule.alpha(mask_time(torch.tensor([1]), cosine)), torch.tensor([0.75]))


def test_the_planner_time_runs_from_0_at_all_noise_to_1_at_clean():
    """t = alpha^{-1}(1 - sum_d p / D) at its ends: a planner sure every position is noise (or a
    sum rounded just past D) gives t = 0, one sure none is gives t = 1; with `noisy` the share is
    of the positions that can be noise."""
    run = Run(1, 4, 3, 1, Temperature(), LinearSchedule(), None, PhiloxNoise(0), None)
    assert planner_time(torch.tensor([4.0, 4.0001, 0.0]), run).tolist() == [0.0, 0.0, 1.0]
    assert planner_time(torch.tensor([1.0, 0.0]), run, torch.tensor([2.0, 1.0])).tolist() == [0.5, 1.0]


def test_write_changes_only_the_allowed_chosen_positions():
    x = torch.tensor([[0, 1, 2, 3]])
    out = write(x, torch.tensor([[2, 0]]), torch.tensor([[4, 4]]), torch.tensor([[True, False]]))
    assert out.tolist() == [[0, 1, 4, 3]]


@pytest.mark.parametrize("vocab", [5, 300])
@pytest.mark.parametrize("per_row", [1, 3])
def test_reference_and_fused_draws_agree_on_random_logits(vocab, per_row):
    """The two Draws strategies draw the same positions, masks and tokens from one source."""
    noise, rows = PhiloxNoise(3, first_row=7), torch.tensor([4, 0, 9, 2])
    reference, fused = ReferenceDraws(noise, Execution()), FusedDraws(noise, Execution(fused=True))
    logits = torch.randn(4, 6) * 3
    x = torch.randint(0, vocab, (4, 6))
    for mask_id in (None, vocab):
        a = reference.plan(5, logits, rows, per_row, "sigmoid", 0.1, x, mask_id)
        b = fused.plan(5, logits, rows, per_row, "sigmoid", 0.1, x, mask_id)
        for name in ("positions", "stop", "masked", "count"):
            assert (getattr(a, name) is None and getattr(b, name) is None) or torch.equal(getattr(a, name),
                                                                                         getattr(b, name))
        assert torch.allclose(a.sum_p, b.sum_p)
    token_logits = torch.randn(4, 6, vocab) * 2
    positions = a.positions
    for temperature in (0.0, 0.7):
        assert torch.equal(reference.tokens_from(2, rows, token_logits, positions, temperature),
                           fused.tokens_from(2, rows, token_logits, positions, temperature))
        exclude = x if vocab == 5 else None
        assert torch.equal(reference.tokens_everywhere(2, rows, token_logits, temperature, exclude),
                           fused.tokens_everywhere(2, rows, token_logits, temperature, exclude))
    assert reference.rows_with(torch.tensor([True, False, True, False])).tolist() == [0, 2]
    assert fused.rows_with(torch.tensor([True, False, True, False])) is None


class _Recorded(PhiloxNoise):
    """PhiloxNoise that records the number of columns of each block it hands out."""

    def __init__(self):
        super().__init__(0)
        self.cols = []

    def uniform(self, step, stream, rows, cols):
        self.cols.append(cols)
        return super().uniform(step, stream, rows, cols)


@pytest.mark.parametrize("vocab,width", [(TILE, TILE), (TILE + 1, noise_width(TILE + 1))])
def test_a_draw_over_one_tile_reads_no_tile_uniform(vocab, width):
    """A draw over at most TILE tokens reads V uniforms of its row, one over more V + n_tiles
    (the layout of ddpd.ops.sample_categorical): where a row's second draw starts in the stream."""
    noise = _Recorded()
    ReferenceDraws(noise, Execution()).categorical(0, torch.arange(2), torch.zeros(4, vocab), 2, 1.0)
    assert noise.cols == [2 * width]


# ----------------------------------------------------------------------------- samplers: determinism, batches

TOY = ToyProblem(dirichlet_p_data(3, 4, seed=0), 3, 4)
M = TOY.models()
SAMPLERS = {
    "ddpd A": lambda B, **kw: ddpd_sample(M.planner, M.uniform_denoiser, B, 4, 3, steps=12, ddpd=DDPDOptions(eps=0.35),
                                          **kw),
    "ddpd mask k=2": lambda B, **kw: ddpd_sample(M.planner, M.mask_denoiser, B, 4, 3, steps=8,
                                                 ddpd=DDPDOptions(stop="budget", k=2, parallel_steps=2),
                                                 denoiser_type="mask", **kw),
    "ddpd exact": lambda B, **kw: ddpd_sample(M.planner_t, M.uniform_denoiser, B, 4, 3, steps=100,
                                              ddpd=DDPDOptions(clock="exact"), time_conditioned_planner=True, **kw),
    "ddpd single model": lambda B, **kw: ddpd_sample_uniform(M.uniform_model, B, 4, 3, steps=8,
                                                             ddpd=DDPDOptions(eps=0.4), **kw),
    "ddpd single model exact": lambda B, **kw: ddpd_sample_uniform(M.uniform_model, B, 4, 3, steps=100,
                                                                   ddpd=DDPDOptions(clock="exact"), **kw),
    "tau mask": lambda B, **kw: tau_leaping_mask(M.mask_denoiser, B, 4, 3, steps=10, eta=0.5, **kw),
    "tau mask eta 0": lambda B, **kw: tau_leaping_mask(M.mask_denoiser, B, 4, 3, steps=40, **kw),
    "tau uniform": lambda B, **kw: tau_leaping_uniform(M.uniform_model, B, 4, 3, steps=10, **kw),
    "tau planned": lambda B, **kw: tau_leaping_planned(M.planner, M.mask_denoiser, B, 4, 3, steps=10,
                                                       denoiser_type="mask", **kw),
    "maskgit": lambda B, **kw: maskgit_sample(M.mask_denoiser, B, 4, 3, steps=3, **kw),
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_sampler_rows_keep_their_draws_across_batch_sizes(name):
    """Philox streams are per row id: the first rows of a bigger batch are the smaller batch,
    even when rows finish and leave the batch at different steps."""
    small, big = SAMPLERS[name](5, seed=123), SAMPLERS[name](23, seed=123)
    assert torch.equal(small.tokens, big.tokens[:5])
    assert torch.equal(small.stop_step, big.stop_step[:5])
    assert not torch.equal(big.tokens, SAMPLERS[name](23, seed=124).tokens)
    assert big.tokens.dtype == torch.long and big.tokens.shape == (23, 4)
    assert ((big.tokens >= 0) & (big.tokens < 3)).all()


def test_generator_seeding_is_reproducible():
    a = SAMPLERS["ddpd A"](9, generator=torch.Generator().manual_seed(5))
    b = SAMPLERS["ddpd A"](9, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.tokens, b.tokens)


def test_eps_stop_bookkeeping():
    """A planner that calls everything clean stops every row before its first move."""
    clean = lambda x: torch.full(x.shape, -20.0)  # noqa: E731
    never = lambda x, t: pytest.fail("the denoiser must not be called")  # noqa: E731
    result = ddpd_sample(clean, never, 6, 4, 3, steps=10, seed=0)
    assert result.steps == 0 and (result.stop_step == 0).all()
    assert result.planner_calls == 1 and result.planner_rows == 6 and result.denoiser_calls == 0
    x0 = ddpd_sample(M.planner, M.uniform_denoiser, 6, 4, 3, steps=1, seed=0, ddpd=DDPDOptions(stop="budget"))
    assert x0.planner_calls == 1 and x0.denoiser_calls == 1 and (x0.stop_step == 1).all()


def test_rows_leave_the_batch_when_they_stop():
    result = SAMPLERS["ddpd A"](400, seed=0)
    stops = result.stop_step
    assert (stops < 12).any() and (stops == 12).any()
    # every planner call covers exactly the rows that had not stopped before it
    assert result.planner_rows == int(sum(min(int(s) + 1, 12) for s in stops))
    assert result.denoiser_rows == int(stops.sum())


def test_exact_clock_counts_denoiser_calls_only_for_accepted_events():
    result = SAMPLERS["ddpd exact"](200, seed=0)
    assert (result.stop_step < 100).all()  # every row reached t_end within the budget
    # a row that reaches t_end at step i has had one planner call per candidate 0..i-1
    assert result.planner_rows == int(result.stop_step.sum())
    assert 0 < result.denoiser_rows < result.planner_rows


# ----------------------------------------------------------------------------- argument checks

def _ddpd(**kw):
    return ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, **{"steps": 3, **kw})


def _opts(**fields):
    return _ddpd(ddpd=DDPDOptions(**fields))


BAD_ARGUMENTS = [
    (lambda: _ddpd(steps=0), ValueError, "steps"),
    (lambda: _ddpd(steps=2.5), TypeError, "steps"),
    (lambda: _opts(selection="max"), ValueError, "selection"),
    (lambda: _opts(stop="never"), ValueError, "stop"),
    (lambda: _opts(eps=0.0), ValueError, "eps"),
    (lambda: _opts(clock="wall"), ValueError, "clock"),
    (lambda: _opts(clock="exact", stop="eps"), ValueError, "stop"),
    (lambda: _ddpd(time_conditioned_planner=True), ValueError,
     r"time_conditioned_planner=True needs DDPDOptions\(clock='exact'\): the planner clock estimates the time"),
    (lambda: _ddpd(time_conditioned_planner=1), TypeError, "time_conditioned_planner"),
    (lambda: _opts(k=5, parallel_steps=1), ValueError, "k"),
    (lambda: _opts(k=4), ValueError, "k=4 acts in the parallel stage only: give parallel_steps > 0"),
    (lambda: _opts(parallel_steps=3), ValueError, "parallel_steps=3 is a stage of k positions a step, and k=1"),
    (lambda: _opts(k=4, policy=ErrorBudget()), ValueError, "k=4 acts in the parallel stage only"),
    (lambda: _opts(k=4, clock="exact"), ValueError, "k=4 acts in the parallel stage only"),
    (lambda: _opts(k=2, parallel_steps=4), ValueError, "parallel_steps"),
    (lambda: _opts(clock="exact", k=2, parallel_steps=1), ValueError, "k > 1"),
    (lambda: _ddpd(temperature=-1.0), ValueError, "temperature"),
    (lambda: _ddpd(temperature=Temperature(1.0, "hot")), TypeError, "temperature_end"),
    (lambda: _opts(t_end=1.0), ValueError, "t_end"),
    (lambda: _opts(t_end=0.5), ValueError, "t_end=0.5 is read by clock='exact' only"),
    (lambda: _ddpd(denoiser_type="gaussian"), ValueError, "denoiser_type"),
    (lambda: _ddpd(mask_id=1), ValueError, "mask_id"),
    (lambda: _ddpd(schedule="quadratic"), ValueError, "schedule"),
    (lambda: ddpd_sample(None, M.uniform_denoiser, 2, 4, 3, steps=3), TypeError, "planner"),
    (lambda: ddpd_sample(M.planner, M.uniform_denoiser, 0, 4, 3, steps=3), ValueError, "batch_size"),
    (lambda: ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 1, steps=3), ValueError, "vocab_size"),
    (lambda: maskgit_sample(M.mask_denoiser, 2, 0, 3, steps=3), ValueError, r"^length must be >= 1, got 0$"),
    (lambda: ddpd_sample(M.planner, lambda x, t: torch.zeros(x.shape[0], 4, 5), 2, 4, 3, steps=3, seed=0),
     ValueError, "denoiser must return"),
    (lambda: ddpd_sample(lambda x: torch.zeros(x.shape[0], 3), M.uniform_denoiser, 2, 4, 3, steps=3, seed=0),
     ValueError, "planner must return"),
    (lambda: tau_leaping_mask(M.mask_denoiser, 2, 4, 3, steps=3, eta=-1.0), ValueError, "eta"),
    (lambda: tau_leaping_mask(M.mask_denoiser, 2, 4, 3, steps=3, eta=float("inf")), ValueError,
     r"eta must be in \[0.0, inf\), got inf"),
    (lambda: tau_leaping_mask("denoiser", 2, 4, 3, steps=3), TypeError, "denoiser must be callable, got str"),
    (lambda: tau_leaping_planned("planner", M.mask_denoiser, 2, 4, 3, steps=3), TypeError,
     "planner must be callable, got str"),
    (lambda: tau_leaping_planned(M.planner, M.uniform_denoiser, 2, 4, 3, steps=3, time_conditioned_planner=1),
     TypeError, "time_conditioned_planner must be a bool, got int 1"),
    (lambda: tau_leaping_planned(M.planner, M.mask_denoiser, 2, 4, 3, steps=3, denoiser_type="x"), ValueError,
     "denoiser_type"),
    (lambda: tau_leaping_uniform("model", 2, 4, 3, steps=3), TypeError, "model"),
    (lambda: maskgit_sample(M.mask_denoiser, 2, 4, 3, steps=3, choice_temperature=-0.1), ValueError,
     "choice_temperature"),
    (lambda: maskgit_sample(M.mask_denoiser, 2, 4, 3, steps=0), ValueError, "steps"),
    (lambda: ddpd_sample_uniform(M.uniform_model, 2, 4, 3, steps=3, seed=1, generator=torch.Generator()),
     ValueError, "at most one"),
]


@pytest.mark.parametrize("call,error,match", BAD_ARGUMENTS, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_bad_device_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N, got 'bogus'"):
        ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=2, device="bogus")
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N, got 'meta'"):
        ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=2, device=torch.device("meta"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            ddpd_sample(M.planner, M.uniform_denoiser, 2, 4, 3, steps=2, device=torch.device("cuda"))


def _elsewhere(network):
    """The network with its output moved off the run's device (as one that moves its input does)."""
    return lambda *args: network(*args).to("meta")


class _HiddenElsewhere(torch.nn.Module):
    """A denoiser with a head whose hidden states come back off the run's device."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 3)

    def hidden(self, x, t):
        return torch.zeros(*x.shape, 4, device="meta")

    def forward(self, x, t):
        return torch.zeros(*x.shape, 3, device="meta")


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("call,match", [
    (lambda e: ddpd_sample(_elsewhere(M.planner), M.uniform_denoiser, 2, 4, 3, steps=3, seed=0, execution=e),
     "planner must return its output on the run's device cpu"),
    (lambda e: ddpd_sample(M.planner, _elsewhere(M.uniform_denoiser), 2, 4, 3, steps=3, seed=0, execution=e),
     "denoiser must return its output on the run's device cpu"),
    (lambda e: ddpd_sample_uniform(_elsewhere(M.uniform_model), 2, 4, 3, steps=3, seed=0, execution=e),
     "model must return its output on the run's device cpu"),
    (lambda e: maskgit_sample(_elsewhere(M.mask_denoiser), 2, 4, 3, steps=3, seed=0, execution=e),
     "denoiser must return its output on the run's device cpu"),
    (lambda e: tau_leaping_planned(_elsewhere(M.planner), M.mask_denoiser, 2, 4, 3, steps=3, seed=0, execution=e,
                                   denoiser_type="mask"), "planner must return its output on the run's device cpu"),
    (lambda e: tau_leaping_uniform(_elsewhere(M.uniform_model), 2, 4, 3, steps=3, seed=0, execution=e),
     "model must return its output on the run's device cpu"),
    (lambda e: ddpd_sample(M.planner, _HiddenElsewhere(), 2, 4, 3, steps=3, seed=0, execution=e),
     r"denoiser(\.hidden)? must return its output on the run's device cpu \(where x is\), got meta"),
], ids=["planner", "denoiser", "uniform model", "maskgit", "tau planned", "tau uniform model", "head"])
def test_a_network_output_on_another_device_is_refused_with_a_clear_error(call, match, fused):
    """Outputs off the run's device failed deep in torch (the reference) or named an op's
    argument (the fused run) rather than the network."""
    with pytest.raises(ValueError, match=match):
        call(Execution(fused=fused))


@pytest.mark.parametrize("fused", [False, True])
def test_a_network_returning_no_tensor_is_named(fused):
    """A network returning a tuple (logits with its hidden states) or a list is named, with what it gave."""
    def pair(network):
        return lambda *args: (network(*args), None)

    with pytest.raises(TypeError, match="^planner must return a tensor, got list$"):
        ddpd_sample(lambda x: M.planner(x).tolist(), M.uniform_denoiser, 2, 4, 3, steps=3, seed=0,
                    execution=Execution(fused=fused))
    with pytest.raises(TypeError, match="^denoiser must return a tensor, got tuple$"):
        ddpd_sample(M.planner, pair(M.uniform_denoiser), 2, 4, 3, steps=3, seed=0, execution=Execution(fused=fused))
    with pytest.raises(TypeError, match="^model must return a tensor, got tuple$"):
        ddpd_sample_uniform(pair(M.uniform_model), 2, 4, 3, steps=3, seed=0, execution=Execution(fused=fused))


@pytest.mark.parametrize("fused", [False, True])
def test_integer_logits_are_refused_with_a_clear_error(fused):
    """A network returning integer logits (a rounded or argmax output) is named, not drawn from."""
    def integers(network):
        return lambda *args: network(*args).round().long()

    with pytest.raises(ValueError, match=r"planner must return floating logits of shape \[2, 4\], got torch.int64"):
        ddpd_sample(integers(M.planner), M.uniform_denoiser, 2, 4, 3, steps=3, seed=0, execution=Execution(fused=fused))
    with pytest.raises(ValueError, match=r"denoiser must return floating logits of shape \[2, 4, 3\], got torch.int64"):
        maskgit_sample(integers(M.mask_denoiser), 2, 4, 3, steps=3, seed=0, execution=Execution(fused=fused))


def test_hidden_states_of_another_width_than_the_head_are_refused():
    """The fused run applies the head to denoiser.hidden: a width the head does not take is named."""
    class Wider(_HiddenElsewhere):
        def hidden(self, x, t):
            return torch.zeros(*x.shape, 5)

    with pytest.raises(ValueError, match=r"denoiser\.hidden must return hidden states of shape \[2, 4, 4\], "
                                         r"got \[2, 4, 5\]"):
        ddpd_sample(M.planner, Wider(), 2, 4, 3, steps=3, seed=0, execution=Execution(fused=True))


def test_a_head_with_another_vocabulary_is_refused():
    """A head of V + 1 outputs (a mask column kept) would draw ids past the vocabulary."""
    class MaskColumn(_HiddenElsewhere):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 4)

        def hidden(self, x, t):
            return torch.zeros(*x.shape, 4)

    with pytest.raises(ValueError, match=r"denoiser\.head must have 3 outputs, got 4"):
        ddpd_sample(M.planner, MaskColumn(), 2, 4, 3, steps=3, seed=0, execution=Execution(fused=True))


class _HiddenOfX(_HiddenElsewhere):
    """A denoiser whose hidden takes x alone (the examples' split): never to be called here."""

    def hidden(self, x):
        raise AssertionError("the check must not call the network")


class _LinearHidden(torch.nn.Module):
    """A denoiser whose `hidden` is a layer, not a method of (x, t)."""

    def __init__(self):
        super().__init__()
        self.hidden, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)


@pytest.mark.parametrize("network,guidance,call,given", [
    (_HiddenOfX, None, r"hidden\(x, t\)", r"hidden\(x\)"),
    (_LinearHidden, None, r"hidden\(x, t\)", r"hidden\(input: torch.Tensor\) -> torch.Tensor"),
    (_HiddenElsewhere, Guidance(torch.tensor([0, 1]), scale=2.0), r"hidden\(x, t, labels=\.\.\.\)",
     r"hidden\(x, t\)"),
], ids=["x only", "a layer", "no labels"])
def test_a_hidden_the_fused_run_cannot_call_is_named_before_the_first_step(network, guidance, call, given):
    """The fused run calls denoiser.hidden(x, t): a hidden(x) failed inside the first step with a
    bare TypeError about positional arguments that named neither the network nor its contract."""
    with pytest.raises(TypeError, match=rf"^denoiser \({network.__name__}\) has an nn.Linear head, so the fused "
                                        rf"run calls its {call}, but its {given} cannot be called so .*: "
                                        rf"define {call} returning the hidden states"):
        ddpd_sample(M.planner, network(), 2, 4, 3, steps=3, seed=0, guidance=guidance,
                    execution=Execution(fused=True))


class _Uniforms:
    """A NoiseSource of the caller's own that returns what `make` makes of the right uniforms."""

    def __init__(self, make):
        self.make = make

    def uniform(self, step, stream, rows, cols):
        return self.make(PhiloxNoise(5).uniform(step, stream, rows, cols))


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("sampler", ["ddpd A", "ddpd exact", "tau uniform", "maskgit"])
@pytest.mark.parametrize("make,match", [
    (lambda u: u[:, 1:], r"noise.uniform\(step, stream, rows, cols\) must return torch.float32 of shape \(2, \d+\) "
                         r"on cpu, got torch.float32 of shape \(2, \d+\) on cpu"),
    (lambda u: u.double(), "must return torch.float32 of shape .* got torch.float64"),
    (lambda u: u.numpy(), "must return torch.float32 of shape .* got ndarray"),
    (lambda u: u.to("meta"), "must return torch.float32 of shape .* on cpu, got .* on meta"),
    (lambda u: torch.zeros_like(u), r"noise.uniform values must be uniforms in \(0, 1\], got 0.0"),
], ids=["shape", "dtype", "numpy", "device", "zero"])
def test_a_noise_source_that_breaks_its_contract_is_refused(make, match, sampler, fused):
    """Another shape failed in a reshape deep in a draw (maskgit, tau-leaping), and the exact
    clock's reference run took uniforms of 0 (an infinite holding time) without a word."""
    with pytest.raises(ValueError, match=match):
        SAMPLERS[sampler](2, noise=_Uniforms(make), execution=Execution(fused=fused))


def test_conditional_planner_is_refused_where_no_planner_runs():
    labels = torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match="maskgit_sample: Guidance.conditional_planner does not apply"):
        maskgit_sample(M.mask_denoiser, 2, 4, 3, steps=2, seed=0, guidance=Guidance(labels, conditional_planner=True))
    with pytest.raises(TypeError, match="tau_leaping_mask: Guidance.conditional_planner does not apply"):
        tau_leaping_mask(M.mask_denoiser, 2, 4, 3, steps=2, seed=0, guidance=Guidance(labels, conditional_planner=True))


@pytest.mark.parametrize("fused", [False, True])
def test_a_philox_offset_given_as_a_tensor_draws_what_the_int_draws(fused):
    """check_seed allows an int64 tensor of one element (the bits of the uint64) for the
    offset as for the seed; the samplers failed on it with an OverflowError."""
    runs = [ddpd_sample(M.planner, M.uniform_denoiser, 3, 4, 3, steps=6, execution=Execution(fused=fused),
                        noise=PhiloxNoise(7, offset))
            for offset in (5, torch.tensor(5), 2**64 - 3, torch.tensor(-3))]
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[2].tokens, runs[3].tokens)
    assert not torch.equal(runs[0].tokens, runs[2].tokens)


def test_the_top_uniform_fires_a_certain_event_and_gives_a_positive_exponential():
    """u = 1.0, the top grid value, fires an event of probability 1 and gives an exponential > 0, not 0."""
    top = torch.tensor([1.0])
    assert bool(happens(top, 1.0)) and bool(happens(top, torch.tensor([1.0])))
    assert float(exponential(top)) > 0


@pytest.mark.parametrize("fused", [False, True])
def test_the_exact_clock_accepts_a_certain_event_at_the_top_uniform(fused):
    """A planner sure that every position is noise (sum_d p = D) makes each candidate an event: the
    acceptance reads min(u, BELOW_ONE) D < sum_d p, so u = 1.0 accepts too, and each step commits."""
    result = ddpd_sample(lambda x: torch.full(x.shape, 30.0), M.uniform_denoiser, 3, 4, 3, steps=5,
                         ddpd=DDPDOptions(clock="exact", t_end=0.5), noise=_Uniforms(torch.ones_like),
                         execution=Execution(fused=fused))
    assert result.commits.tolist() == [5, 5, 5]


def test_an_event_needs_a_uniform_below_its_probability():
    """happens(u, p) is u < p, as ddpd.ops.bernoulli draws: u == p is no event, and p = 0 never fires."""
    u = torch.tensor([2**-25, 0.25, 0.5])
    assert not happens(u, u).any() and not happens(u, 0.0).any()
    assert happens(u, torch.nextafter(u, torch.ones(3))).all()


def test_check_option_takes_none_only_where_optional():
    """None passes where the keyword is optional and is a TypeError naming the class otherwise."""
    assert check_option("s", "guidance", None, Guidance, optional=True) is None
    with pytest.raises(TypeError, match=r"s: ddpd must be a DDPDOptions \(ddpd.sampling.options\), got NoneType"):
        check_option("s", "ddpd", None, DDPDOptions)
    with pytest.raises(TypeError, match=r"s: guidance must be a Guidance or None \(ddpd.sampling.options\), got int"):
        check_option("s", "guidance", 3, Guidance, optional=True)
