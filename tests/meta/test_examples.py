"""The examples (examples/): the MDLM-style and LLaDA-style samplers written against
ddpd.ops return the tokens of their plain-torch versions from the same noise, greedy and
sampled, with and without top-p (tied logits at its boundary included); they run as
scripts. The LLaDA-style sampler draws the law of LLaDA's rule (or, on request, of ranking
by the tempered probability), decodes blocks left to right, guides and reads padded
prompts as LLaDA's loop does, and keeps its plain twin's tokens with a bf16 network. Every
script of examples/ and benchmarks/ answers --help with its usage and runs nothing."""
import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy import stats

from hang_guard import HANG_GUARD_SECONDS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCRIPTS = sorted(path for folder in ("examples", "benchmarks", "docs/parallel") for path in (ROOT / folder).glob("*.py")
                 if 'if __name__ == "__main__":' in path.read_text())


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.8), dict(temperature=1.3),
                                dict(temperature=0.0, top_p=0.8)])  # greedy: top_p of the law at T = 1
@pytest.mark.parametrize("seed", [0, 5])
def test_mdlm_sampler_matches_its_plain_torch_version(kw, seed):
    mdlm = load("mdlm_sampler")
    net = mdlm.TinyDenoiser(40, 12, seed=seed)
    fused = mdlm.mdlm_ddpd(net, 3, 12, 6, seed=seed, **kw)
    assert torch.equal(fused, mdlm.mdlm_plain(net, 3, 12, 6, seed=seed, **kw))
    assert not (fused == net.mask_id).any()  # the last step reveals every position
    # the draws of a sequence do not depend on the batch it is sampled in
    assert torch.equal(mdlm.mdlm_ddpd(net, 1, 12, 6, seed=seed, **kw), fused[:1])


def test_mdlm_sampler_cuts_a_greedy_draw_as_ddpd_does():
    """At temperature 0 ddpd's top_p keeps the nucleus of the law at T = 1: its log-probability
    of the greedy token is that token's log-softmax over the plain cut's kept logits."""
    from ddpd.ops import sample_categorical

    mdlm = load("mdlm_sampler")
    logits = torch.randn(64, 40, generator=torch.Generator().manual_seed(0)) * 2
    cut = mdlm.top_p_mask(logits, 0.8, 0.0)
    drawn = sample_categorical(logits, 0.0, top_p=0.8, return_logprob=True, seed=0)
    assert torch.equal(drawn.tokens, cut.argmax(-1))
    want = cut.log_softmax(-1).gather(-1, drawn.tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(drawn.logprob, want, rtol=0, atol=1e-5)
    assert (cut > float("-inf")).sum(-1).lt(40).any()  # the cut does cut


def test_mdlm_sampler_reveals_each_position_at_a_uniform_step(monkeypatch):
    """MDLM's linear schedule reveals a masked position with probability (t - s) / t = 1 / (T - i)
    at step i, so its reveal step is uniform over the T steps: chi-square over 12k positions
    (the step is the first at which its coin comes up, the coins recorded from the loop)."""
    mdlm = load("mdlm_sampler")
    coins = {}

    def recorded(p, **kw):
        drawn = bernoulli(p, **kw)
        coins[kw["offset"] // 2] = drawn[..., 0]
        return drawn

    bernoulli = mdlm.bernoulli
    monkeypatch.setattr(mdlm, "bernoulli", recorded)
    steps, net = 6, mdlm.TinyDenoiser(20, 12, seed=0)
    mdlm.mdlm_ddpd(net, 1000, 12, steps, seed=3)
    first = torch.stack([coins[i] for i in range(steps)]).long().argmax(0)  # the first True
    counts = torch.bincount(first.flatten(), minlength=steps)
    assert stats.chisquare(counts.numpy()).pvalue > 1e-3, counts.tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mdlm_sampler_matches_its_plain_torch_version_with_a_low_precision_network(dtype):
    """Both loops draw from float32 logits of the network's hidden states: the plain loop's
    net(x) rounded them to the dtype, and 96 of 1280 bf16 rows (40 seeds) differed."""
    mdlm = load("mdlm_sampler")
    for seed in range(4):
        net = mdlm.TinyDenoiser(50, 16, seed=seed).to(dtype)
        for kw in (dict(temperature=1.0), dict(temperature=0.8, top_p=0.9)):
            fused = mdlm.mdlm_ddpd(net, 8, 16, 8, seed=seed, **kw)
            assert torch.equal(fused, mdlm.mdlm_plain(net, 8, 16, 8, seed=seed, **kw)), (seed, kw)


@pytest.mark.parametrize("seed", [0, 5])
def test_mdlm_sampler_keeps_tied_logits_at_the_top_p_boundary_as_ddpd_does(seed):
    """Tokens 2i and 2i + 1 share their head row, so every logit is tied with another; ddpd
    keeps every token tied with the last one top-p keeps, and so must the plain version."""
    mdlm = load("mdlm_sampler")
    net = mdlm.TinyDenoiser(40, 12, seed=seed)
    with torch.no_grad():
        net.head.weight[1::2] = net.head.weight[0::2]
        net.head.bias[1::2] = net.head.bias[0::2]
    kw = dict(temperature=0.7, top_p=0.8)
    x = torch.randint(0, net.mask_id + 1, (8, 12), generator=torch.Generator().manual_seed(seed))
    logits = net(x).flatten(0, 1)  # states like the sampler's: tokens and masks
    assert torch.equal(logits[:, 1::2], logits[:, 0::2])
    # The case is the one that matters: in some rows the sort-order cut splits a tied pair.
    probs = torch.softmax(logits / kw["temperature"], -1)
    sorted_probs, order = probs.sort(-1, descending=True)
    cut_in_sort_order = torch.zeros_like(probs, dtype=torch.bool).scatter(
        -1, order, sorted_probs.cumsum(-1) - sorted_probs < kw["top_p"])
    kept_with_ties = mdlm.top_p_mask(logits, kw["top_p"], kw["temperature"]) > float("-inf")
    assert (cut_in_sort_order != kept_with_ties).any(1).any()
    assert torch.equal(mdlm.mdlm_ddpd(net, 3, 12, 6, seed=seed, **kw), mdlm.mdlm_plain(net, 3, 12, 6, seed=seed, **kw))


def test_mdlm_sampler_builds_its_tensors_on_the_network_device(monkeypatch):
    """Copied next to a CUDA network, a loop building x, rows or p on the CPU fails at its first
    op: every tensor either loop creates names the network's device (recorded, CPU here)."""
    mdlm = load("mdlm_sampler")
    devices = []

    class RecordingTorch:
        def __getattr__(self, name):
            made = getattr(torch, name)
            if name not in ("full", "arange", "zeros", "ones", "empty", "rand", "tensor"):
                return made

            def record(*args, **kw):
                devices.append(kw.get("device"))
                return made(*args, **kw)
            return record

    monkeypatch.setattr(mdlm, "torch", RecordingTorch())
    net = mdlm.TinyDenoiser(20, 6)
    for sampler in (mdlm.mdlm_ddpd, mdlm.mdlm_plain):
        sampler(net, 2, 6, 3, seed=0)
    assert devices and all(device == net.head.weight.device for device in devices), devices


@pytest.mark.parametrize("kw, error, match", [(dict(steps=0), ValueError, "steps must be >= 1"),
                                              (dict(steps=2.0), TypeError, "steps must be an int"),
                                              (dict(batch=0), ValueError, "batch must be >= 1"),
                                              (dict(length=-1), ValueError, "length must be >= 1"),
                                              (dict(top_p=0.0), ValueError, "top_p must be in"),
                                              (dict(top_p=1.5), ValueError, "top_p must be in")])
def test_mdlm_sampler_names_the_bad_argument(kw, error, match):
    """Both loops refuse what the fused one cannot draw: no steps would return all-mask."""
    mdlm = load("mdlm_sampler")
    net = mdlm.TinyDenoiser(20, 6)
    args = dict(batch=2, length=6, steps=3, seed=0) | kw
    for sampler in (mdlm.mdlm_ddpd, mdlm.mdlm_plain):
        with pytest.raises(error, match=match):
            sampler(net, **args)


LLADA_OPTIONS = [dict(), dict(rank_by="draw"), dict(remasking="random"), dict(block_length=5),
                 dict(cfg_scale=0.5), dict(block_length=5, cfg_scale=1.0, remasking="random")]


class Recording(torch.nn.Module):
    """A network that keeps a copy of every input it is called on."""

    def __init__(self, net):
        super().__init__()
        self.net, self.mask_id, self.inputs = net, net.mask_id, []

    def forward(self, x, attention_mask=None):
        self.inputs.append((x.clone(), attention_mask))
        return self.net(x, attention_mask)


def varied_denoiser(llada, vocab: int, length: int, seed: int, dtype=torch.float32):
    """The example network with its head scaled down: its own is so peaked that greedy answers
    repeat one token, and a wrong token or position written would go unseen."""
    net = llada.TinyDenoiser(vocab, length, seed=seed)
    with torch.no_grad():
        net.head.weight.div_(4)
    return Recording(net.to(dtype))


def same_runs(llada, net, *args, **kw) -> bool:
    """The fused and plain loops write the same tokens at the same steps (every network input
    is the same) and return the same answers."""
    net.inputs.clear()
    fused = llada.llada_ddpd(net, *args, **kw)
    fused_inputs = [x for x, _ in net.inputs]
    net.inputs.clear()
    plain = llada.llada_plain(net, *args, **kw)
    return torch.equal(fused, plain) and all(map(torch.equal, fused_inputs, [x for x, _ in net.inputs]))


@pytest.mark.parametrize("options", LLADA_OPTIONS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "-")
@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0])
def test_llada_sampler_matches_its_plain_torch_version(temperature, options):
    llada = load("llada_sampler")
    net = varied_denoiser(llada, 40, 14, seed=3)
    prompt = torch.randint(0, 40, (4, 4), generator=torch.Generator().manual_seed(1))
    assert same_runs(llada, net, prompt, 10, 4, temperature, seed=7, **options)
    fused = llada.llada_ddpd(net, prompt, 10, 4, temperature, seed=7, **options)
    assert torch.equal(fused[:, :4], prompt) and not (fused == net.mask_id).any()
    assert len(fused[:, 4:].unique()) >= 3  # answers of several tokens


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_llada_sampler_matches_its_plain_torch_version_with_a_bf16_network(temperature):
    """Both loops rank float32 confidences: a plain softmax in bf16 ties distinct confidences
    and commits other positions."""
    llada = load("llada_sampler")
    for seed in range(4):
        net = varied_denoiser(llada, 40, 14, seed=seed, dtype=torch.bfloat16)
        prompt = torch.randint(0, 40, (16, 4), generator=torch.Generator().manual_seed(seed))
        assert same_runs(llada, net, prompt, 10, 5, temperature, seed=seed), seed


class CoupledPair(torch.nn.Module):
    """A network over [prompt, answer of 2] whose answer positions are coupled: position 0's
    logits are flat (scale 0.5), position 1's peaked (scale 2), and each is shifted by a
    row (scale 3) of the token written at the other, so the order of writing shapes the law."""

    def __init__(self, vocab: int = 6, seed: int = 25):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.mask_id = vocab
        self.base = torch.randn(2, vocab, generator=g) * torch.tensor([[0.5], [2.0]])
        self.coupling = torch.cat([3 * torch.randn(vocab, vocab, generator=g), torch.zeros(1, vocab)])

    def forward(self, x, attention_mask=None):
        logits = torch.zeros(*x.shape, self.base.shape[1])
        logits[:, -2] = self.base[0] + self.coupling[x[:, -1]]
        logits[:, -1] = self.base[1] + self.coupling[x[:, -2]]
        return logits


def llada_exact_law(net, prompt: torch.Tensor, temperature: float, rank_by: str) -> torch.Tensor:
    """Float64[V, V]: the law of a two-position answer decoded in two steps, by enumeration:
    step 1 draws a token at both positions from softmax(logits / T) and writes the one of
    higher confidence (its probability at temperature 1, LLaDA's rule, or at T: "draw");
    step 2 draws the other position given it."""
    masked = torch.cat([prompt, torch.full((1, 2), net.mask_id)], 1)
    start = prompt.shape[1]
    logits = net(masked)[0, start:].double()
    drawn = torch.softmax(logits / temperature, -1)
    confidence = torch.softmax(logits / (temperature if rank_by == "draw" else 1.0), -1)
    law = torch.zeros(logits.shape[1], logits.shape[1], dtype=torch.float64)
    for first in (0, 1):
        other = 1 - first
        wins = (confidence[first][:, None] > confidence[other][None, :]).double()
        p_first = drawn[first] * (wins * drawn[other]).sum(1)  # P(first is written, with token a)
        for token, p in enumerate(p_first):
            x = masked.clone()
            x[0, start + first] = token
            p_other = p * torch.softmax(net(x)[0, start + other].double() / temperature, -1)
            if first == 0:
                law[token] += p_other
            else:
                law[:, token] += p_other
    return law


@pytest.mark.parametrize("temperature", [0.7, 2.0])
@torch.no_grad()
def test_llada_sampler_draws_llada_law_or_on_request_the_tempered_confidence_law(temperature):
    """LLaDA ranks a token drawn at temperature T by its probability at temperature 1: the
    sampler's answers follow that exact law (chi-square over 1e5 answers, p > 1e-4), and with
    rank_by="draw" the law of ranking by the tempered probability; the two laws differ (total
    variation 0.084 at T 0.7, 0.066 at T 2)."""
    llada = load("llada_sampler")
    net = CoupledPair()
    prompt = torch.tensor([[2]])
    laws = {rank_by: llada_exact_law(net, prompt, temperature, rank_by) for rank_by in ("model", "draw")}
    assert 0.5 * (laws["model"] - laws["draw"]).abs().sum() > 0.05  # the test can tell them apart
    for rank_by, law in laws.items():
        answers = llada.llada_ddpd(net, prompt.expand(100_000, 1), 2, 2, temperature, seed=11, rank_by=rank_by)
        assert chi_square_p(answers[:, 1] * 6 + answers[:, 2], law.flatten()) > 1e-4, rank_by


def chi_square_p(outcomes: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of the outcome counts against probs (bins expecting fewer than 5 pooled)."""
    observed = torch.bincount(outcomes, minlength=probs.numel()).double()
    expected = probs / probs.sum() * outcomes.numel()
    small = expected < 5
    observed = torch.cat([observed[~small], observed[small].sum()[None]])
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    return float(stats.chisquare(observed[keep].numpy(), expected[keep].numpy()).pvalue)


@pytest.mark.parametrize("sampler", ["llada_ddpd", "llada_plain"])
def test_llada_sampler_decodes_blocks_left_to_right(sampler):
    """block_length 3 of a 9-token answer in 6 steps: 2 steps per block, each block full before
    the next one starts, every later position masked meanwhile."""
    llada = load("llada_sampler")
    net = Recording(llada.TinyDenoiser(30, 13, seed=1))
    prompt = torch.randint(0, 30, (5, 4), generator=torch.Generator().manual_seed(2))
    out = getattr(llada, sampler)(net, prompt, 9, 6, 0.8, seed=3, block_length=3)
    assert len(net.inputs) == 6 and not (out == net.mask_id).any()
    for step, (x, _) in enumerate(net.inputs):
        block = 4 + 3 * (step // 2)
        assert torch.equal(x[:, :block], out[:, :block])  # earlier blocks are done
        assert (x[:, block + 3:] == net.mask_id).all()  # later blocks untouched
        assert ((x[:, block:block + 3] == net.mask_id).sum(1) == (3 if step % 2 == 0 else 1)).all()


def test_llada_sampler_guidance_runs_the_network_on_the_prompt_masked_too():
    """cfg_scale s: logits u + (s + 1) (c - u), u those of x with every prompt position masked."""
    llada = load("llada_sampler")
    net = Recording(llada.TinyDenoiser(30, 10, seed=1))
    prompt = torch.randint(0, 30, (3, 4), generator=torch.Generator().manual_seed(2))
    x = torch.cat([prompt, torch.full((3, 6), net.mask_id)], 1)
    guided = llada.denoiser_logits(net, x, 4, 1.5, None)
    (both, _), = net.inputs
    assert torch.equal(both[:3], x) and (both[3:, :4] == net.mask_id).all() and torch.equal(both[3:, 4:], x[:, 4:])
    unconditional = net.net(both[3:])
    torch.testing.assert_close(guided, unconditional + 2.5 * (net.net(x) - unconditional))
    # guidance changes the answers (the guided run is not the plain one)
    kw = dict(temperature=1.0, seed=4)
    guided_answers = llada.llada_ddpd(net, prompt, 6, 3, cfg_scale=1.5, **kw)
    assert not torch.equal(guided_answers, llada.llada_ddpd(net, prompt, 6, 3, **kw))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_llada_sampler_never_attends_to_the_padding_of_a_left_padded_prompt(temperature):
    """The answers do not depend on the padding's tokens under the attention mask (the
    logits do without it), the padding is kept, and the fused and plain loops agree."""
    llada = load("llada_sampler")
    net = llada.TinyDenoiser(30, 14, seed=5)
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, 30, (4, 6), generator=g)
    attention_mask = torch.ones(4, 6, dtype=torch.long)
    attention_mask[0, :3] = attention_mask[2, :1] = 0  # rows 0 and 2 left-padded
    other_padding = torch.where(attention_mask.bool(), prompt, torch.randint(0, 30, (4, 6), generator=g))
    kw = dict(seed=8, attention_mask=attention_mask)
    fused = llada.llada_ddpd(net, prompt, 8, 4, temperature, **kw)
    assert torch.equal(fused, llada.llada_plain(net, prompt, 8, 4, temperature, **kw))
    assert torch.equal(fused, torch.cat([prompt, fused[:, 6:]], 1))
    repadded = llada.llada_ddpd(net, other_padding, 8, 4, temperature, **kw)
    assert torch.equal(repadded[:, 6:], fused[:, 6:])
    # the padding's tokens do reach the answer's logits without the mask
    x, repadded_x = (torch.cat([p, torch.full((4, 8), net.mask_id)], 1) for p in (prompt, other_padding))
    full_mask = torch.cat([attention_mask, torch.ones(4, 8, dtype=torch.long)], 1)
    torch.testing.assert_close(net(x, full_mask)[:, 6:], net(repadded_x, full_mask)[:, 6:])
    assert not torch.allclose(net(x)[[0, 2], 6:], net(repadded_x)[[0, 2], 6:])


def test_llada_sampler_refuses_an_attention_mask_of_other_values_than_0_and_1():
    """An additive mask (0: a token, -inf: padding) read as 0/1 would swap tokens and padding."""
    llada = load("llada_sampler")
    net = llada.TinyDenoiser(20, 14)
    additive = torch.zeros(2, 4)
    additive[0, :2] = float("-inf")
    for sampler in (llada.llada_ddpd, llada.llada_plain):
        with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1"):
            sampler(net, torch.zeros(2, 4, dtype=torch.long), 10, 5, attention_mask=additive)
        assert not (sampler(net, torch.zeros(2, 4, dtype=torch.long), 10, 5, attention_mask=additive == 0)
                    == net.mask_id).any()  # a bool mask is fine


@pytest.mark.parametrize("kw, error, match", [
    (dict(block_length=4), ValueError, "block_length must divide answer"),
    (dict(steps=3, block_length=5), ValueError, "steps must be a multiple"),
    (dict(remasking="lowest"), ValueError, "remasking must be one of"),
    (dict(rank_by="tempered"), ValueError, "rank_by must be one of"),
    (dict(cfg_scale=-1.0), ValueError, "cfg_scale must be in"),
    (dict(temperature=-0.5), ValueError, "temperature must be in"),
    (dict(temperature=None), TypeError, "temperature must be a number"),
    (dict(answer=10.0), TypeError, "answer must be an int"),
    (dict(steps=0), ValueError, "steps must be >= 1"),
    (dict(block_length=True), TypeError, "block_length must be an int"),
    (dict(prompt=torch.zeros(4, dtype=torch.long)), ValueError, "prompt must be 2-D"),
    (dict(prompt=torch.zeros(2, 4)), TypeError, "prompt must have dtype"),
    (dict(attention_mask=torch.ones(2, 3)), ValueError, "attention_mask must have shape")])
def test_llada_sampler_names_the_bad_argument(kw, error, match):
    llada = load("llada_sampler")
    net = llada.TinyDenoiser(20, 14)
    args = dict(prompt=torch.zeros(2, 4, dtype=torch.long), answer=10, steps=4) | kw
    for sampler in (llada.llada_ddpd, llada.llada_plain):
        with pytest.raises(error, match=match):
            sampler(net, **args)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["mdlm_sampler", "llada_sampler"])
def test_examples_run_as_scripts(name):
    result = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], capture_output=True, text=True,
                            timeout=HANG_GUARD_SECONDS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "False" not in result.stdout and result.stdout.count("True") == 2


@pytest.mark.integration
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_scripts_answer_help_without_running(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                            timeout=HANG_GUARD_SECONDS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: {script.name}") and result.stderr == ""
    # the help is the script's docstring (its first line at least), and nothing was run after it
    summary = ast.get_docstring(ast.parse(script.read_text())).splitlines()[0]
    last = result.stdout.rstrip().split("\n\n")[-1]
    assert summary in result.stdout and last.startswith(("options:", "optional arguments:"))  # Python 3.9's
