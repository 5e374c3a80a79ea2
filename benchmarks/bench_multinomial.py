"""multinomial on CPU against torch.multinomial, at the shape of one GPT-2-vocabulary
denoising step (64 rows, 50257 weights). Run with
`pytest benchmarks/bench_multinomial.py --benchmark-only`; each ddpd benchmark prints
its speed-up over the torch benchmark of the same work, timed in the same run.
Targets: k = 1 at least 5x torch.multinomial; k = 16 without replacement faster than
torch.multinomial(replacement=False)."""
import pytest
import torch

from ddpd.ops.multinomial import multinomial, multinomial_reference

ROWS, VOCAB = 64, 50257


@pytest.fixture(scope="module")
def weights():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, VOCAB, generator=g) * 3  # softmax weights, as a denoiser gives
    return torch.softmax(logits, -1)


def test_torch_multinomial_k1(versus, weights):
    versus("k=1", "torch.multinomial", torch.multinomial, weights, 1)


def test_reference_k1(versus, weights):
    versus("k=1", "reference", multinomial_reference, weights, 1, True, seed=1)


def test_ddpd_multinomial_k1(versus, weights):
    versus("k=1", "ddpd", multinomial, weights, 1, True, seed=1, baselines=("torch.multinomial", "reference"))


def test_torch_multinomial_k16_without_replacement(versus, weights):
    versus("k=16 without replacement", "torch.multinomial", torch.multinomial, weights, 16, replacement=False)


def test_ddpd_multinomial_k16_without_replacement(versus, weights):
    versus("k=16 without replacement", "ddpd", multinomial, weights, 16, False, seed=1,
           baselines=("torch.multinomial",))


def test_torch_multinomial_k16_with_replacement(versus, weights):
    versus("k=16 with replacement", "torch.multinomial", torch.multinomial, weights, 16, replacement=True)


def test_ddpd_multinomial_k16_with_replacement(versus, weights):
    versus("k=16 with replacement", "ddpd", multinomial, weights, 16, True, seed=1, baselines=("torch.multinomial",))
