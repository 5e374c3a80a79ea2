"""multinomial on CPU against plain torch, at the shape of one GPT-2-vocabulary
denoising step (64 rows, 50257 weights), and without replacement also at 4096 rows of
text8's 27 characters (short rows: the k sequential draws, not the pass over the
weights, take the time). Run with
`pytest benchmarks/bench_multinomial.py --benchmark-only`; each ddpd benchmark prints
its speed-up over each torch benchmark of the same work, timed in the same run, and the
session summary names the fastest torch code (benchmarks/torch_draws.py):
torch.multinomial, and for the same law cumsum + searchsorted of one uniform per draw
(with replacement) or the Gumbel-top-k trick (without replacement).
Targets: k = 1 at least 5x torch.multinomial; k = 16 without replacement faster than
torch.multinomial(replacement=False)."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddpd.ops.multinomial import multinomial, multinomial_reference  # noqa: E402
from torch_draws import TORCH, gumbel_top_k, inverse_cdf  # noqa: E402

ROWS, VOCAB = 64, 50257
SHORT_ROWS, SHORT_VOCAB = 4096, 27
SHORT = f"k=16 without replacement, {SHORT_ROWS} x {SHORT_VOCAB}"
MULTINOMIAL, INVERSE_CDF, GUMBEL_TOP_K = TORCH + "torch.multinomial", TORCH + "inverse CDF", TORCH + "Gumbel-top-k"


def softmax_weights(rows: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g) * 3  # softmax weights, as a denoiser gives
    return torch.softmax(logits, -1)


@pytest.fixture(scope="module")
def weights():
    return softmax_weights(ROWS, VOCAB)


@pytest.fixture(scope="module")
def short_rows():
    return softmax_weights(SHORT_ROWS, SHORT_VOCAB)


def test_torch_multinomial_k1(versus, weights):
    versus("k=1", MULTINOMIAL, torch.multinomial, weights, 1)


def test_inverse_cdf_k1(versus, weights):
    versus("k=1", INVERSE_CDF, inverse_cdf, weights, 1)


def test_reference_k1(versus, weights):
    versus("k=1", "reference", multinomial_reference, weights, 1, True, seed=1)


def test_ddpd_multinomial_k1(versus, weights):
    versus("k=1", "ddpd", multinomial, weights, 1, True, seed=1, baselines=(MULTINOMIAL, INVERSE_CDF, "reference"))


def test_torch_multinomial_k16_without_replacement(versus, weights):
    versus("k=16 without replacement", MULTINOMIAL, torch.multinomial, weights, 16, replacement=False)


def test_gumbel_top_k_k16_without_replacement(versus, weights):
    versus("k=16 without replacement", GUMBEL_TOP_K, gumbel_top_k, weights, 16)


def test_ddpd_multinomial_k16_without_replacement(versus, weights):
    versus("k=16 without replacement", "ddpd", multinomial, weights, 16, False, seed=1,
           baselines=(MULTINOMIAL, GUMBEL_TOP_K))


def test_torch_multinomial_k16_with_replacement(versus, weights):
    versus("k=16 with replacement", MULTINOMIAL, torch.multinomial, weights, 16, replacement=True)


def test_inverse_cdf_k16_with_replacement(versus, weights):
    versus("k=16 with replacement", INVERSE_CDF, inverse_cdf, weights, 16)


def test_ddpd_multinomial_k16_with_replacement(versus, weights):
    versus("k=16 with replacement", "ddpd", multinomial, weights, 16, True, seed=1,
           baselines=(MULTINOMIAL, INVERSE_CDF))


def test_torch_multinomial_short_rows(versus, short_rows):
    versus(SHORT, MULTINOMIAL, torch.multinomial, short_rows, 16, replacement=False)


def test_gumbel_top_k_short_rows(versus, short_rows):
    versus(SHORT, GUMBEL_TOP_K, gumbel_top_k, short_rows, 16)


def test_ddpd_multinomial_short_rows(versus, short_rows):
    versus(SHORT, "ddpd", multinomial, short_rows, 16, False, seed=1, baselines=(MULTINOMIAL, GUMBEL_TOP_K))
