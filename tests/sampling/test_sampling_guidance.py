"""Class labels and classifier-free guidance in the samplers.

A class-conditional toy (oracles.toy.Labelled: two classes, one exact ToyProblem each, the
mixture as the unconditional model): with guidance_scale 1 the exact clock and
class-conditional exact networks reach p(x | c) for every class in one batch; scale 0 is the
unconditional model; scale 2 follows the exact law of the guided chain (oracles.toy.Guided).
On tiny transformers the fused run, which guides the hidden states before the linear head,
draws what the reference run draws from the guided logits. B = 50k rows per law check;
threshold as in tests/sampling/test_sampling_ddpd.py.
"""
import warnings

import pytest
import torch

from ddpd.models import build_model, config_for
from ddpd.sampling import (
    NaNOutputWarning,
    PhiloxNoise,
    ddpd_sample,
    ddpd_sample_uniform,
    mask_sample,
    maskgit_sample,
    tau_leaping_mask,
    tau_leaping_uniform,
)
from ddpd.sampling.batch import check_hidden, extended_softmax, guided
from ddpd.sampling.options import DDPDOptions, Execution, Guidance
from ddpd.sampling.policies import ConfidenceFactor, ConfidenceThreshold, EntropyBound, MaskGIT
from oracles import laws
from oracles.fixtures import noise, single_thread  # noqa: F401  (single_thread: autouse)
from oracles.stats import TVTable, empirical, threshold, tv
from oracles.toy import Guided, Labelled, ToyProblem, dirichlet_p_data

B = 50_000
T_END = 1.0 - 1e-4
TABLE = TVTable("Class-conditional sampling: TV to own exact law and to p(x | c) (B = 50k)")


@pytest.fixture(scope="module", autouse=True)
def print_table():
    yield
    print("\n" + TABLE.render())


@pytest.fixture(scope="module")
def labelled():
    return Labelled([ToyProblem(dirichlet_p_data(3, 3, seed=s), 3, 3) for s in (11, 12)], [0.3, 0.7])


def by_class(labelled, result, labels, c):
    problem = labelled.problems[c]
    return empirical(problem.index(result.tokens[labels == c]), problem.N), int((labels == c).sum())


def test_guidance_one_reaches_each_class_law(labelled):
    labels = (torch.arange(B) % 2).long()
    m = labelled.models
    result = ddpd_sample(m.planner_t, m.uniform_denoiser, B, 3, 3, steps=220,
                         ddpd=DDPDOptions(clock="exact", t_end=T_END), time_conditioned_planner=True,
                         guidance=Guidance(labels, conditional_planner=True), noise=noise(1))
    for c, problem in enumerate(labelled.problems):
        emp, n = by_class(labelled, result, labels, c)
        limit = threshold(problem.p_data, n)
        TABLE.add(f"exact clock, guidance 1, class {c} [dir S3 D3]", None, tv(emp, problem.p_data), limit, problem.N)
        assert tv(emp, problem.p_data) < limit


def test_guidance_zero_is_the_unconditional_model(labelled):
    labels = torch.zeros(300, dtype=torch.long)
    m = labelled.models
    guided = ddpd_sample(m.planner, m.uniform_denoiser, 300, 3, 3, steps=8, ddpd=DDPDOptions(stop="budget"),
                         guidance=Guidance(labels, scale=0.0), seed=4)
    unconditional = ddpd_sample(m.planner, lambda x, t: m.uniform_denoiser(x, t), 300, 3, 3, steps=8,
                                ddpd=DDPDOptions(stop="budget"), seed=4)
    assert torch.equal(guided.tokens, unconditional.tokens)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_guidance_keeps_the_tokens_a_network_forbids(fused):
    """-inf logits (a forbidden token) under guidance: (-inf) - (-inf) and 0 * -inf made NaN,
    read as -inf, so scale 0 was not the unconditional model and a token forbidden by both
    networks warned of NaN outputs at every pass."""
    base = torch.tensor([3.0, 1.0, 0.5, 0.0, -1.0])

    def denoiser(x, t, labels=None):
        logits = base.expand(*x.shape, 5).clone()
        logits[..., 4] = float("-inf")  # forbidden by both networks
        if labels is not None:
            logits[labels == 0, :, 0] = float("-inf")  # class 0 forbids the unconditional argmax
        return logits

    def sample(**kw):
        with warnings.catch_warnings():
            warnings.simplefilter("error", NaNOutputWarning)
            return tau_leaping_mask(denoiser, 6, 4, 5, steps=4, temperature=0.0, seed=0,
                                    execution=Execution(fused=fused), **kw).tokens

    zeros, ones = torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.long)
    assert bool((sample() == 0).all())
    assert torch.equal(sample(guidance=Guidance(zeros, scale=0.0)), sample())
    assert torch.equal(sample(guidance=Guidance(zeros, scale=1e-46)), sample())  # 0 in float32
    assert bool((sample(guidance=Guidance(zeros, scale=0.5)) == 1).all())  # -inf for any scale in (0, 1]
    assert bool((sample(guidance=Guidance(ones, scale=2.0)) == 0).all())


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_a_token_only_the_conditional_network_allows_is_certain_beyond_scale_1(fused):
    """(1 - w) (-inf) + w c = +inf for w > 1: the guided law, not an overflow of the
    networks, so no NaN warning (it counted the guided logits)."""

    def denoiser(x, t, labels=None):
        logits = torch.zeros(*x.shape, 5)
        if labels is None:
            logits[..., 4] = float("-inf")
        return logits

    with warnings.catch_warnings():
        warnings.simplefilter("error", NaNOutputWarning)
        result = tau_leaping_mask(denoiser, 6, 4, 5, steps=4, seed=0, execution=Execution(fused=fused),
                                  guidance=Guidance(torch.zeros(6, dtype=torch.long), scale=2.0))
    assert bool((result.tokens == 4).all()) and result.denoiser_nan_passes == 0


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("sampler", ["tau_leaping_uniform", "ddpd_sample_uniform"])
def test_the_uniform_samplers_read_a_row_with_inf_logits_as_certain(sampler, fused):
    """Beyond scale 1 a token only the conditional network allows has logit +inf: the uniform
    tau-leaping rate and the single uniform model's planner and denoiser read the row as certain
    of it (softmax alone gave NaN: the rate never jumped, and the positions kept their noise)."""

    def model(x, t, labels=None):
        logits = torch.zeros(*x.shape, 5)
        logits[..., 1] = 3.0
        if labels is None:
            logits[:, :3, 4] = float("-inf")
        return logits

    run = tau_leaping_uniform if sampler == "tau_leaping_uniform" else ddpd_sample_uniform
    result = run(model, 4, 6, 5, steps=30, seed=0, execution=Execution(fused=fused),
                 guidance=Guidance(torch.zeros(4, dtype=torch.long), scale=2.0))
    assert bool((result.tokens[:, :3] == 4).all()), result.tokens


def test_extended_softmax_is_uniform_over_inf_entries_and_softmax_elsewhere():
    logits = torch.randn(3, 4, 7, generator=torch.Generator().manual_seed(0))
    logits[0, 1, [2, 5]] = float("inf")
    logits[2, 3, 6] = float("inf")
    logits[1, 0, 3] = float("-inf")
    finite = torch.ones(3, 4, dtype=torch.bool)
    finite[0, 1] = finite[2, 3] = False
    for log, plain in ((False, logits.softmax(-1)), (True, logits.log_softmax(-1))):
        got = extended_softmax(logits, log=log)
        assert torch.equal(got[finite], plain[finite])  # bit for bit
        p = got.exp() if log else got
        assert p[0, 1].tolist() == [0, 0, 0.5, 0, 0, 0.5, 0] and p[2, 3].tolist() == [0] * 6 + [1]


STEP_0_COMMITS = [  # (+inf entries at positions 0-2, policy, the positions step 0 commits)
    (1, ConfidenceThreshold(0.9), [0, 1, 2]),  # p = 1 at 0-2, e^3 / (e^3 + 4) = 0.83 at 3-5
    (1, MaskGIT(0.0), [2]),  # one commit: the most confident, the last of the tie at p = 1
    (1, ConfidenceFactor(1.0), [0, 1, 2, 3, 4]),  # (n + 1)(1 - c_(n)) < 1: 0 for n <= 3, then 0.83, 1.00
    (1, EntropyBound(0.1), [0, 1, 2, 3]),  # entropy 0 at 0-2, so the next one fits the bound too
    (2, ConfidenceThreshold(0.6), [3, 4, 5]),  # p = 1/2 at 0-2
]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("n_inf,policy,committed", STEP_0_COMMITS, ids=[f"{n} {type(p).__name__}"
                                                                        for n, p, _ in STEP_0_COMMITS])
def test_the_mask_loop_reads_a_row_with_inf_logits_as_uniform_over_them(n_inf, policy, committed, fused):
    """Guidance beyond scale 1 gives +inf where only the conditional network allows a token: the
    law is uniform over the +inf entries, as the draws read it (log_softmax gave NaN, read as
    confidence 0, so a certain position was committed last)."""
    inputs = []  # the conditional network's inputs, one a step

    def denoiser(x, t, labels=None):
        logits = torch.zeros(*x.shape, 5)
        logits[..., 1] = 3.0
        if labels is None:
            logits[:, :3, 5 - n_inf:] = float("-inf")
        else:
            inputs.append(x.clone())
        return logits

    result = mask_sample(denoiser, 1, 6, 5, steps=4, policy=policy, seed=0, execution=Execution(fused=fused),
                         guidance=Guidance(torch.zeros(1, dtype=torch.long), scale=2.0))
    assert (inputs[1][0] != 5).nonzero().flatten().tolist() == committed
    assert bool((result.tokens[0, :3] >= 5 - n_inf).all())  # drawn among the +inf entries
    # a threshold every position passes commits them all at step 0, as with a finite certain logit
    everything = mask_sample(denoiser, 1, 6, 5, steps=4, policy=ConfidenceThreshold(0.4), seed=0,
                             execution=Execution(fused=fused), guidance=Guidance(torch.zeros(1, dtype=torch.long), 2.0))
    assert everything.stop_step.tolist() == [1]


def test_guided_logits_at_forbidden_tokens():
    """(1 - w) u + w c in the extended reals; -inf where both networks forbid the token."""
    inf = float("inf")
    u, c = torch.tensor([-inf, -inf, 1.0, -inf]), torch.tensor([-inf, 2.0, -inf, inf])
    assert guided(u, c, 0.0).tolist() == [-inf, -inf, 1.0, -inf]
    assert guided(u, c, 0.5).tolist() == [-inf, -inf, -inf, -inf]
    assert guided(u, c, 1.0).tolist() == [-inf, 2.0, -inf, inf]
    assert guided(u, c, 3.0).tolist() == [-inf, inf, -inf, inf]
    with pytest.raises(ValueError, match="scale must be in"):
        Guidance(torch.zeros(2, dtype=torch.long), scale=1e300)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_guided_sampler_follows_the_guided_law(labelled, fused):
    labels = torch.zeros(B, dtype=torch.long)
    m = labelled.models
    result = ddpd_sample(m.planner, m.uniform_denoiser, B, 3, 3, steps=8, ddpd=DDPDOptions(stop="budget"),
                         guidance=Guidance(labels, scale=2.0, conditional_planner=True),
                         execution=Execution(fused=fused), seed=7)
    guided = Guided(labelled.problems[0], labelled.mixture, 2.0)
    law = laws.ddpd_planner_clock_law(guided, 8, ddpd=DDPDOptions(stop="budget"))
    emp = empirical(guided.index(result.tokens), guided.N)
    limit = threshold(law, B)
    TABLE.add(f"planner clock B, guidance 2, class 0{' (fused)' if fused else ''} [dir S3 D3]", tv(emp, law),
              tv(emp, guided.p_data), limit, guided.N)
    assert tv(emp, law) < limit
    wrong = laws.ddpd_planner_clock_law(Guided(labelled.problems[0], labelled.mixture, 1.0), 8,
                                        ddpd=DDPDOptions(stop="budget"))
    assert tv(emp, wrong) > limit  # the guidance changed the law


class LabelledNet(torch.nn.Module):
    """A tiny transformer denoiser with a label embedding added to its hidden states (null: None)."""

    def __init__(self, vocab, classes, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.net = build_model("mask-denoiser", config_for("mask-denoiser", vocab, 8, d_model=16, n_layers=1,
                                                           n_heads=2))
        self.embed = torch.nn.Embedding(classes + 1, 16)
        self.head = self.net.head
        self.null = classes

    def hidden(self, x, t, labels=None):
        labels = torch.full((x.shape[0],), self.null, dtype=torch.long) if labels is None else labels
        return self.net.hidden(x, t) + 3.0 * self.embed(labels)[:, None, :]

    def forward(self, x, t, labels=None):
        return self.head(self.hidden(x, t, labels))


@pytest.mark.parametrize("vocab", [27, 300])
def test_fused_guided_hidden_states_draw_the_reference_guided_logits(vocab):
    net = LabelledNet(vocab, 4, 0).eval()
    planner = build_model("planner", config_for("planner", vocab, 8, d_model=16, n_layers=1, n_heads=2)).eval()
    labels = torch.arange(64) % 4
    runs = {}
    with torch.inference_mode():
        for fused in (False, True):
            runs[fused] = ddpd_sample(planner, net, 64, 8, vocab, steps=12, denoiser_type="mask",
                                      guidance=Guidance(labels, scale=2.5), noise=PhiloxNoise(5),
                                      execution=Execution(fused=fused, sync_every=1))
            runs[("maskgit", fused)] = maskgit_sample(net, 64, 8, vocab, steps=4, guidance=Guidance(labels, scale=1.5),
                                                      seed=2, execution=Execution(fused=fused))
    assert torch.equal(runs[False].tokens, runs[True].tokens)
    assert torch.equal(runs[("maskgit", False)].tokens, runs[("maskgit", True)].tokens)
    unguided = maskgit_sample(net, 64, 8, vocab, steps=4, guidance=Guidance(labels), seed=2)
    assert not torch.equal(unguided.tokens, runs[("maskgit", False)].tokens)


@pytest.mark.parametrize("labels,scale,match", [
    (torch.zeros(2, 2, dtype=torch.long), 1.0, r"labels must be 1-D, got shape \(2, 2\)"),
    (torch.tensor([0, -1]), 1.0, ">= 0"),
    (torch.zeros(2, dtype=torch.long), -1.0, "scale"),
    (torch.zeros(2, dtype=torch.long), float("inf"), r"scale must be in \[0.0, 3.4028234663852886e\+38\], got inf"),
])
def test_bad_guidance_is_refused(labels, scale, match):
    with pytest.raises(ValueError, match=match):
        Guidance(labels, scale=scale)
    with pytest.raises(TypeError, match="conditional_planner must be a bool, got int 1"):
        Guidance(torch.zeros(2, dtype=torch.long), conditional_planner=1)
    with pytest.raises(TypeError, match=r"labels must have dtype in \(torch.int64\), got torch.int32"):
        Guidance(torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="labels must be a torch.Tensor, got list"):
        Guidance([0, 1])


def test_labels_of_another_batch_size_are_refused(labelled):
    with pytest.raises(ValueError, match=r"shape \[2\]"):
        tau_leaping_uniform(labelled.models.uniform_denoiser, 2, 3, 3, steps=2, seed=0,
                            guidance=Guidance(torch.zeros(3, dtype=torch.long)))
    # no labels at all: built (no least id to read), then refused for its shape, not by a failed min()
    with pytest.raises(ValueError, match=r"of shape \[2\], got torch.int64 of shape \(0,\)"):
        tau_leaping_uniform(labelled.models.uniform_denoiser, 2, 3, 3, steps=2, seed=0,
                            guidance=Guidance(torch.zeros(0, dtype=torch.long)))


def test_a_network_with_a_null_label_is_guided_in_one_batched_pass():
    from ddpd.sampling.batch import Condition, _Call

    torch.manual_seed(0)
    net = build_model("mask-denoiser", config_for("mask-denoiser", 27, 8, d_model=16, n_layers=1, n_heads=2,
                                                  num_classes=3)).eval()
    with torch.no_grad():  # adaLN starts at zero, where the labels change nothing
        for p in net.parameters():
            p.normal_(0.0, 0.5)
    x, t, labels = torch.randint(0, 28, (5, 8)), torch.rand(5), torch.tensor([0, 1, 2, 1, 0])
    with torch.no_grad():
        assert not torch.allclose(net(x, t, labels=labels), net(x, t, labels=None), atol=1e-3)
    condition = Condition(labels, 2.5)
    calls = []

    def guide(network):
        conditional, unconditional = condition.outputs(network, x, t, torch.arange(5))
        return guided(unconditional, conditional, 2.5)

    with torch.no_grad():
        batched = guide(_Call(net, "__call__"))
        net.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
        guide(_Call(net, "__call__"))
        separate = guide(lambda x, t, labels: net(x, t, labels=labels))
    assert calls[0] == 10  # one pass of 2B rows, then the callable's two passes of B
    assert calls[1:] == [5, 5]
    assert torch.allclose(batched, separate, atol=1e-5)
    assert torch.allclose(separate, net(x, t, labels=None) + 2.5 * (net(x, t, labels=labels) - net(x, t, labels=None)),
                          atol=1e-5)


@pytest.mark.parametrize("null_label", [True, False], ids=["null-label", "callable"])
@pytest.mark.parametrize("fused", [False, True])
def test_a_guided_step_counts_two_denoiser_passes_a_row(null_label, fused):
    torch.manual_seed(0)
    net = build_model("mask-denoiser", config_for("mask-denoiser", 27, 8, d_model=16, n_layers=1, n_heads=2,
                                                  num_classes=3)).eval()
    evaluated = []  # rows of each body call: forward runs hidden, the fused run calls it alone
    body = net.hidden

    def counted(x, t, labels=None):
        evaluated.append(x.shape[0])
        return body(x, t, labels=labels)

    net.hidden = counted
    denoiser = net if null_label else (lambda x, t, labels=None: net(x, t, labels=labels))
    labels = torch.tensor([0, 1, 2, 1])
    with torch.no_grad():
        result = maskgit_sample(denoiser, 4, 8, 27, steps=4, seed=0, guidance=Guidance(labels, scale=2.0),
                                execution=Execution(fused=fused, sync_every=1))
    # the cosine schedule leaves 7, 5, 3, 0 of the 8 masks: every row runs the 4 steps
    assert result.stop_step.tolist() == [4] * 4
    assert result.denoiser_passes.tolist() == [8] * 4  # conditional and unconditional at each step
    assert result.denoiser_rows == sum(evaluated) == 4 * 2 * 4
    assert result.denoiser_calls == len(evaluated) == 4 * (1 if null_label else 2)


@pytest.mark.parametrize("fused", [False, True])
def test_guidance_zero_evaluates_the_unconditional_network_alone(fused):
    """At w = 0 the guided output is u exactly: the conditional pass was run, counted as a second
    pass a row and its NaN warned of, though no token read it."""
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    called_with = []

    def denoiser(x, t, labels=None):
        called_with.append(labels)
        logits = base.expand(*x.shape, 5).clone()
        return logits if labels is None else torch.full_like(logits, float("nan"))

    with warnings.catch_warnings():
        warnings.simplefilter("error", NaNOutputWarning)
        result = maskgit_sample(denoiser, 3, 8, 5, steps=4, seed=0, execution=Execution(fused=fused),
                                guidance=Guidance(torch.zeros(3, dtype=torch.long), scale=0.0))
    unguided = maskgit_sample(lambda x, t: base.expand(*x.shape, 5).clone(), 3, 8, 5, steps=4, seed=0,
                              execution=Execution(fused=fused))
    assert torch.equal(result.tokens, unguided.tokens)
    assert called_with and all(labels is None for labels in called_with)
    assert result.denoiser_nan_passes == 0
    assert result.denoiser_passes.tolist() == unguided.denoiser_passes.tolist() == [4] * 3
    assert result.denoiser_rows == unguided.denoiser_rows


@pytest.mark.parametrize("fused", [False, True])
def test_a_guided_pass_on_some_rows_counts_two_denoiser_passes_a_row(fused):
    """Mask tau-leaping's reference run calls the denoiser on the rows with an unmasking only:
    that pass too is two evaluations of each row it holds, as the fused run counts them."""
    table = torch.randn(3, 6, 5, generator=torch.Generator().manual_seed(0))

    def denoiser(x, t, labels=None):
        return table[2].expand(*x.shape, 5) if labels is None else table[labels]

    guide = Guidance(torch.tensor([0, 1, 0, 1]), scale=2.0)
    with torch.no_grad():
        result = tau_leaping_mask(denoiser, 4, 6, 5, steps=12, seed=3, guidance=guide,
                                  execution=Execution(fused=fused, sync_every=1))
        unguided = tau_leaping_mask(lambda x, t: table[2].expand(*x.shape, 5), 4, 6, 5, steps=12,
                                    seed=3, execution=Execution(fused=fused, sync_every=1))
    assert result.denoiser_passes.tolist() == [2 * n for n in unguided.denoiser_passes.tolist()]
    assert int(unguided.denoiser_passes.min()) < 12  # steps without an unmasking: passes on some rows only


def test_a_head_network_whose_hidden_takes_no_labels_is_refused_before_a_guided_run():
    """Under guidance the fused run calls hidden(x, t, labels=...): a hidden(x, t) is refused up front."""
    class NoLabels(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 3)

        def hidden(self, x, t):
            return torch.zeros(*x.shape, 4)

    check_hidden("denoiser", NoLabels(), labels=False)
    with pytest.raises(TypeError, match=r"^denoiser \(NoLabels\) has an nn.Linear head, so the fused run calls its "
                                        r"hidden\(x, t, labels=\.\.\.\), but its hidden\(x, t\) cannot be called so"):
        check_hidden("denoiser", NoLabels(), labels=True)
