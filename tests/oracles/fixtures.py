"""Fixtures shared by the sampler test modules (import them into a module to use them):
the named toy problems (built once per process), a seeded noise source, one thread."""
import pytest
import torch

from ddpd.sampling import TorchNoise
from oracles.toy import ToyProblem, dirichlet_p_data, markov_p_data, sparse_p_data

TOYS = {
    "dir S3 D3": lambda: ToyProblem(dirichlet_p_data(3, 3, seed=1), 3, 3),
    "sparse S2 D4": lambda: ToyProblem(sparse_p_data(2, 4, support=5, seed=2), 2, 4),
    "dir S5 D2": lambda: ToyProblem(dirichlet_p_data(5, 2, seed=3), 5, 2),
    "sparse S4 D3": lambda: ToyProblem(sparse_p_data(4, 3, support=12, seed=4), 4, 3),
    "dir S3 D2": lambda: ToyProblem(dirichlet_p_data(3, 2, seed=5), 3, 2),
    "support5 S3 D3": lambda: ToyProblem(sparse_p_data(3, 3, support=5, seed=2), 3, 3),
    **{f"markov S2 D{D}": (lambda D=D: ToyProblem(markov_p_data(D), 2, D)) for D in (2, 4, 6, 8)},
}
_cache = {}


def toy(name):
    """The toy problem `name` of TOYS (its exact oracles are costly: built once)."""
    if name not in _cache:
        _cache[name] = TOYS[name]()
    return _cache[name]


def noise(seed=0):
    return TorchNoise(torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Run torch single-threaded: the oracle tests are many small ops, which intra-op
    threads slow down many times over on a loaded machine. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_network(kind: str, vocab: int, seed: int, scale: float = 1.0, length: int = 8):
    """A tiny randomly initialised ddpd.models network (d_model 16, one layer) in eval mode; its
    head scaled by `scale` spreads the logits, so stops and confident draws happen."""
    from ddpd.models import build_model, config_for

    torch.manual_seed(seed)
    model = build_model(kind, config_for(kind, vocab, length, d_model=16, n_layers=1, n_heads=2)).eval()
    with torch.no_grad():
        model.head.weight.mul_(scale)
    return model


def tiny_networks(vocabularies=(27, 300)) -> dict:
    """{vocab: planner, uniform (denoiser), mask (denoiser), model (single uniform model)}, the
    tiny networks the sampler tests pin and compare runs on (one tile at V = 27, two at 300)."""
    return {v: dict(planner=tiny_network("planner", v, 0, 40.0), uniform=tiny_network("uniform-denoiser", v, 1, 20.0),
                    mask=tiny_network("mask-denoiser", v, 2, 20.0), model=tiny_network("uniform", v, 3, 20.0))
            for v in vocabularies}
