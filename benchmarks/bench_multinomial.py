"""multinomial on CPU against plain torch, at the shape of one GPT-2-vocabulary denoising
step (64 rows, 50257 weights), and without replacement also at 4096 rows of text8's 27
characters (short rows: the k sequential draws, not the pass over the weights, take the time).

Run: `pytest benchmarks/bench_multinomial.py --benchmark-only`. Variants of each case, timed
in the same run (benchmarks/conftest.py): torch.multinomial, and for the same law
(ddpd.testing.baselines) cumsum + searchsorted of one uniform per draw (with replacement) or
the Gumbel-top-k trick (without replacement); reference (with replacement, k = 1); fused,
ddpd's op. Targets: k = 1 at least 5x torch.multinomial; k = 16 without replacement faster
than torch.multinomial(replacement=False).
"""
import pytest
import torch

from ddpd.ops import reference
from ddpd.ops.multinomial import multinomial
from ddpd.testing.baselines import TORCH, gumbel_top_k, inverse_cdf

ROWS, VOCAB = 64, 50257
SHORT_ROWS, SHORT_VOCAB = 4096, 27
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


K1 = {
    MULTINOMIAL: lambda w: torch.multinomial(w, 1),
    INVERSE_CDF: lambda w: inverse_cdf(w, 1),
    "reference": lambda w: reference.multinomial(w, 1, True, seed=1),
    "fused": lambda w: multinomial(w, 1, True, seed=1),
}
WITHOUT_REPLACEMENT = {
    MULTINOMIAL: lambda w: torch.multinomial(w, 16, replacement=False),
    GUMBEL_TOP_K: lambda w: gumbel_top_k(w, 16),
    "fused": lambda w: multinomial(w, 16, False, seed=1),
}
WITH_REPLACEMENT = {
    MULTINOMIAL: lambda w: torch.multinomial(w, 16, replacement=True),
    INVERSE_CDF: lambda w: inverse_cdf(w, 16),
    "fused": lambda w: multinomial(w, 16, True, seed=1),
}


@pytest.mark.parametrize("variant", list(K1))
def test_multinomial_k1(compare, weights, variant):
    compare("multinomial", (ROWS, VOCAB), variant, lambda: K1[variant](weights), params="k=1")


@pytest.mark.parametrize("variant", list(WITHOUT_REPLACEMENT))
def test_multinomial_k16_without_replacement(compare, weights, variant):
    compare("multinomial", (ROWS, VOCAB), variant, lambda: WITHOUT_REPLACEMENT[variant](weights),
            params="k=16 without replacement")


@pytest.mark.parametrize("variant", list(WITH_REPLACEMENT))
def test_multinomial_k16_with_replacement(compare, weights, variant):
    compare("multinomial", (ROWS, VOCAB), variant, lambda: WITH_REPLACEMENT[variant](weights), params="k=16")


@pytest.mark.parametrize("variant", list(WITHOUT_REPLACEMENT))
def test_multinomial_short_rows(compare, short_rows, variant):
    compare("multinomial", (SHORT_ROWS, SHORT_VOCAB), variant, lambda: WITHOUT_REPLACEMENT[variant](short_rows),
            params="k=16 without replacement")
