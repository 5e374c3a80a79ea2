"""Fixtures shared by the sampler test modules (import them into a module to use them)."""
import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Run torch single-threaded: the oracle tests are many small ops, which intra-op
    threads slow down many times over on a loaded machine. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
