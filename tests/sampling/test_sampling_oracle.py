"""The exact oracles themselves: checked against ddpd.process, Monte Carlo of the forward
process, and each other, so that the sampler tests built on them mean something."""
import pytest
import torch

from ddpd.process import corrupt, denoiser_prob_from_uniform, planner_prob_from_uniform
from ddpd.sampling.options import DDPDOptions
from oracles import laws
from oracles.fixtures import single_thread  # noqa: F401  (autouse)
from oracles.stats import empirical, threshold, tv
from oracles.toy import ToyProblem, dirichlet_p_data, sparse_p_data

TOYS = [
    ToyProblem(dirichlet_p_data(3, 3, seed=1), 3, 3),
    ToyProblem(sparse_p_data(2, 4, support=5, seed=2), 2, 4),
    ToyProblem(sparse_p_data(5, 2, support=6, seed=3), 5, 2),
]


@pytest.mark.parametrize("toy", TOYS, ids=["dir S3 D3", "sparse S2 D4", "sparse S5 D2"])
def test_oracle_matches_the_rate_decomposition(toy):
    """p(z = N | x_t) and p(x_1 | x_t, z = N) summed directly over (x_1, z) equal the
    decomposition of eqs. corruption_prob and denoising_prob applied to p(x_1 | x_t)."""
    idx = torch.arange(toy.N).repeat(4)
    alpha = torch.linspace(0.01, 0.99, idx.numel(), dtype=torch.float64)
    p_x1 = toy.p_x1(idx, alpha)
    assert torch.allclose(p_x1.sum(-1), torch.ones(()).double(), atol=1e-12)
    x = toy.states[idx]
    assert torch.allclose(toy.planner_t(idx, alpha), planner_prob_from_uniform(p_x1, x, alpha), atol=1e-12)
    assert torch.allclose(toy.uniform_denoiser(idx, alpha), denoiser_prob_from_uniform(p_x1, x, alpha), atol=1e-10)


@pytest.mark.parametrize("toy", TOYS[:2], ids=["dir S3 D3", "sparse S2 D4"])
def test_time_free_planner_is_the_average_over_the_forward_process(toy):
    """E[z^d = N | x_t] over t ~ U(0, 1), x_1 ~ p_data, (x_t, z) ~ corrupt: max z-score 5."""
    n = 300_000
    g = torch.Generator().manual_seed(0)
    x1 = toy.states[torch.multinomial(toy.p_data, n, replacement=True, generator=g)]
    x_t, z = corrupt(x1, torch.rand(n, generator=g), "linear", "uniform", toy.S, generator=g)
    idx = toy.index(x_t)
    counts = torch.bincount(idx, minlength=toy.N).double()
    noisy = torch.zeros(toy.N, toy.D, dtype=torch.float64).index_add_(0, idx, z.double())
    p = toy.planner_free
    z_score = (noisy / counts[:, None] - p).abs() / (p * (1 - p) / counts[:, None]).sqrt()
    assert float(z_score.max()) < 5


def test_time_free_planner_quadrature_is_exact_for_the_linear_schedule():
    p = sparse_p_data(3, 3, support=7, seed=4)
    few, many = ToyProblem(p, 3, 3), ToyProblem(p, 3, 3, quadrature_nodes=40)
    assert torch.allclose(few.planner_free, many.planner_free, atol=1e-13)


def test_mask_denoiser_table():
    toy = TOYS[0]
    table = toy.mask_table
    assert torch.allclose(table.sum(-1), torch.ones(()).double())
    all_masked = toy.mask_index(torch.full((1, toy.D), toy.S))
    marginals = torch.stack([toy.p_data.view(*(toy.S,) * toy.D).sum([e for e in range(toy.D) if e != d])
                             for d in range(toy.D)])
    assert torch.allclose(table[all_masked][0], marginals)
    clean = toy.mask_index(toy.states)
    assert torch.equal(table[clean].argmax(-1), toy.states)


def test_single_position_kernel_equals_the_general_construction():
    toy = TOYS[0]
    p = toy.planner_free
    alpha = 1.0 - p.mean(-1)
    fast = laws.ddpd_kernel(toy, p, alpha, "sigmoid", 1, 0.8, "uniform")
    general = torch.zeros_like(fast)
    q = laws.tempered(toy.uniform_denoiser(torch.arange(toy.N), alpha), 0.8)
    for (d,), prob in laws.set_probabilities(p, 1).items():
        laws.scatter_draws(general, toy.states, toy.S, [d], prob, q[:, [d]])
    assert torch.allclose(fast, general, atol=1e-14)
    assert torch.allclose(fast.sum(-1), torch.ones(()).double())


def test_laws_are_distributions():
    toy = TOYS[1]
    for law in (laws.ddpd_planner_clock_law(toy, 5, ddpd=DDPDOptions(stop="budget", k=2, parallel_steps=2)),
                laws.ddpd_planner_clock_law(toy, 4, denoiser_type="mask"),
                laws.ddpd_uniform_model_law(toy, 3, ddpd=DDPDOptions(eps=0.2)),
                laws.tau_leaping_mask_law(toy, 7, eta=1.0),
                laws.tau_leaping_uniform_law(toy, 5),
                laws.tau_leaping_planned_law(toy, 5, denoiser_type="mask"),
                laws.maskgit_law(toy, 3, choice_temperature=2.0)):
        assert law.shape == (toy.N,) and float(law.min()) >= -1e-15
        assert abs(float(law.sum()) - 1.0) < 1e-10


def test_threshold_holds_for_true_samples_and_fails_for_a_shifted_law():
    toy = TOYS[0]
    g = torch.Generator().manual_seed(9)
    n = 50_000
    sample = empirical(torch.multinomial(toy.p_data, n, replacement=True, generator=g), toy.N)
    assert tv(sample, toy.p_data) < threshold(toy.p_data, n)
    shifted = 0.97 * toy.p_data + 0.03 / toy.N
    assert tv(sample, shifted) > threshold(shifted, n)
