"""Samples pinned from the samplers as they were before the sampling engine was written once
(commit dc53315): for a given seed every sampler, reference and fused, must keep drawing
exactly these sequences, so a refactoring of the loops cannot change what users get.

tests/data/pinned_samples.json holds, per case, the tokens, stop steps and step count of a
batch of 6 (tiny random transformers, V = 27 and V = 300 so the categorical draw has one tile
and two) and 2 samples of the bundled text8 model.
"""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ddpd.checkpoint import load_bundle
from ddpd.pretrained import BUNDLE_DIR
from ddpd.sampling import (
    ddpd_sample,
    ddpd_sample_uniform,
    maskgit_sample,
    tau_leaping_mask,
    tau_leaping_planned,
    tau_leaping_uniform,
)
from ddpd.sampling.options import DDPDOptions, Execution, Temperature
from oracles.fixtures import single_thread, tiny_networks  # noqa: F401  (single_thread: autouse)

PINNED = json.loads((Path(__file__).parents[1] / "data" / "pinned_samples.json").read_text())


@pytest.fixture(scope="module")
def nets():
    return tiny_networks()


def cases(v):
    """name -> (sampler, models, keyword arguments) for the nets of vocabulary v."""
    planner, mask, uniform, model = ("planner", "mask"), ("mask",), ("planner", "uniform"), ("model",)
    return {
        f"ddpd uniform A V{v}": (ddpd_sample, uniform, dict(steps=16, seed=9, ddpd=DDPDOptions(eps=0.2))),
        f"ddpd mask A+C V{v}": (ddpd_sample, planner, dict(steps=16, seed=9, denoiser_type="mask",
                                                           ddpd=DDPDOptions(selection="softmax", eps=0.2))),
        f"ddpd mask B k3x2 T.7-.2 V{v}": (ddpd_sample, planner,
                                          dict(steps=16, seed=3, denoiser_type="mask",
                                               ddpd=DDPDOptions(stop="budget", k=3, parallel_steps=2),
                                               temperature=Temperature(0.7, 0.2))),
        f"ddpd uniform B k2x3 V{v}": (ddpd_sample, uniform,
                                      dict(steps=16, seed=4, ddpd=DDPDOptions(stop="budget", k=2, parallel_steps=3))),
        f"ddpd exact uniform V{v}": (ddpd_sample, uniform, dict(steps=40, seed=5, ddpd=DDPDOptions(clock="exact"))),
        f"ddpd exact mask V{v}": (ddpd_sample, planner,
                                  dict(steps=40, seed=6, denoiser_type="mask", ddpd=DDPDOptions(clock="exact"))),
        f"ddpd uniform model A V{v}": (ddpd_sample_uniform, model, dict(steps=16, seed=7, ddpd=DDPDOptions(eps=0.2))),
        f"ddpd uniform model exact V{v}": (ddpd_sample_uniform, model,
                                           dict(steps=40, seed=8, ddpd=DDPDOptions(clock="exact"))),
        f"tau mask eta0 V{v}": (tau_leaping_mask, mask, dict(steps=10, seed=10)),
        f"tau mask eta2 V{v}": (tau_leaping_mask, mask, dict(steps=10, seed=11, eta=2.0, temperature=0.9)),
        f"tau uniform V{v}": (tau_leaping_uniform, model, dict(steps=10, seed=12)),
        f"tau planned uniform V{v}": (tau_leaping_planned, uniform, dict(steps=10, seed=13)),
        f"tau planned mask V{v}": (tau_leaping_planned, planner, dict(steps=10, seed=14, denoiser_type="mask")),
        f"maskgit V{v}": (maskgit_sample, mask, dict(steps=4, seed=15, temperature=0.8)),
    }


CASES = {name: (v, case) for v in (27, 300) for name, case in cases(v).items()}


def assert_pinned(name, result):
    pinned = PINNED[name]
    assert result.tokens.tolist() == pinned["tokens"], name
    assert result.stop_step.tolist() == pinned["stop_step"], name
    assert result.steps == pinned["steps"], name


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("name", CASES)
def test_samples_are_pinned(nets, name, fused):
    vocab, (sampler, roles, kwargs) = CASES[name]
    with torch.inference_mode():
        result = sampler(*(nets[vocab][r] for r in roles), 6, 8, vocab, **kwargs, execution=Execution(fused=fused))
    assert_pinned(name, result)


def numpy_ints(value):
    """value with every int in it (keywords, DDPDOptions fields) a numpy integer."""
    if isinstance(value, dict):
        return {name: numpy_ints(v) for name, v in value.items()}
    if isinstance(value, DDPDOptions):
        return dataclasses.replace(value, k=np.int64(value.k), parallel_steps=np.int32(value.parallel_steps))
    return np.int64(value) if type(value) is int else value


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("name", [name for name in CASES if name.endswith("V27")])
def test_numpy_integer_arguments_draw_the_pinned_samples(nets, name, fused):
    """Sizes, steps, seeds and options given as numpy integers (a budget computed with numpy)
    were refused as not ints: they draw the pinned samples, and the result holds ints."""
    vocab, (sampler, roles, kwargs) = CASES[name]
    with torch.inference_mode():
        result = sampler(*(nets[vocab][r] for r in roles), np.int64(6), np.int32(8), np.int64(vocab),
                         **numpy_ints(kwargs), execution=Execution(fused=fused, sync_every=np.int64(8)))
    assert_pinned(name, result)
    assert type(result.steps) is int


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_bundled_model_samples_are_pinned(fused):
    planner, denoiser, _ = load_bundle(str(BUNDLE_DIR))
    with torch.inference_mode():
        result = ddpd_sample(planner, denoiser, 2, 256, 27, steps=24, seed=0, denoiser_type="mask",
                             ddpd=DDPDOptions(stop="budget"), execution=Execution(fused=fused))
    assert_pinned("bundled text8 mask B 24 steps", result)
