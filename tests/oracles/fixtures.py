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
