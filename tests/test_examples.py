"""The examples (examples/): the MDLM-style and LLaDA-style samplers written against
ddpd.ops return the tokens of their plain-torch versions from the same noise, greedy and
sampled, with and without top-p (tied logits at its boundary included); they run as
scripts. Every script of examples/ and benchmarks/ answers --help with its usage and
runs nothing."""
import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hang_guard import HANG_GUARD_SECONDS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = sorted(path for folder in ("examples", "benchmarks") for path in (ROOT / folder).glob("*.py")
                 if 'if __name__ == "__main__":' in path.read_text())


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.8), dict(temperature=1.3)])
@pytest.mark.parametrize("seed", [0, 5])
def test_mdlm_sampler_matches_its_plain_torch_version(kw, seed):
    mdlm = load("mdlm_sampler")
    net = mdlm.TinyDenoiser(40, 12, seed=seed)
    fused = mdlm.mdlm_ddpd(net, 3, 12, 6, seed=seed, **kw)
    assert torch.equal(fused, mdlm.mdlm_plain(net, 3, 12, 6, seed=seed, **kw))
    assert not (fused == net.mask_id).any()  # the last step reveals every position
    # the draws of a sequence do not depend on the batch it is sampled in
    assert torch.equal(mdlm.mdlm_ddpd(net, 1, 12, 6, seed=seed, **kw), fused[:1])


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


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0])
def test_llada_sampler_matches_its_plain_torch_version(temperature):
    llada = load("llada_sampler")
    net = llada.TinyDenoiser(40, 14, seed=3)
    prompt = torch.randint(0, 40, (4, 4), generator=torch.Generator().manual_seed(1))
    fused = llada.llada_ddpd(net, prompt, 10, 4, temperature, seed=7)
    assert torch.equal(fused, llada.llada_plain(net, prompt, 10, 4, temperature, seed=7))
    assert torch.equal(fused[:, :4], prompt) and not (fused == net.mask_id).any()


@pytest.mark.parametrize("name", ["mdlm_sampler", "llada_sampler"])
def test_examples_run_as_scripts(name):
    result = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], capture_output=True, text=True,
                            timeout=HANG_GUARD_SECONDS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "False" not in result.stdout and result.stdout.count("True") == 2


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_scripts_answer_help_without_running(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                            timeout=HANG_GUARD_SECONDS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: {script.name}") and result.stderr == ""
    # the help is the script's docstring (its first line at least), and nothing was run after it
    summary = ast.get_docstring(ast.parse(script.read_text())).splitlines()[0]
    assert summary in result.stdout and result.stdout.rstrip().split("\n\n")[-1].startswith("options:")
