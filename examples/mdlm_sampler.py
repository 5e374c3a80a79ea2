"""An MDLM-style masked-diffusion sampler written against ddpd.ops, beside its plain-torch
version.

MDLM's ancestral update with the linear schedule: from all-mask, at each step every
masked position is revealed with probability (t - s) / t and takes a token drawn from
softmax(logits / temperature), truncated by top_p.

- `mdlm_ddpd`: the coin is ddpd.ops.bernoulli, the token ddpd.ops.sample_from_hidden on
  the hidden states of the masked positions only; draws are keyed by position;
- `mdlm_plain`: the same loop in plain torch (full float32 logits, sort-based top-p,
  ddpd.ops.reference.categorical) from the same uniforms: the same tokens.

docs/examples.md has the details.  Run: python examples/mdlm_sampler.py"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tiny_networks import TinyDenoiser  # noqa: E402

from ddpd.ops import DrawControls, bernoulli, noise_width, philox_uniform, reference, sample_from_hidden  # noqa: E402
from ddpd.ops.rng import BELOW_ONE  # noqa: E402
from ddpd.validation import check_float, check_int  # noqa: E402


def check_options(batch: int, length: int, steps: int, top_p: float | None) -> None:
    """Validate the arguments of both loops: with no step nothing is revealed, and the plain
    top-p would cut at a top_p the fused op refuses."""
    for name, value in (("batch", batch), ("length", length), ("steps", steps)):
        check_int(name, value, 1)
    if top_p is not None:
        check_float("top_p", top_p, 0.0, 1.0, open_min=True)


def all_mask(net: TinyDenoiser, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The all-mask start and one Philox stream (row id) per position, on the network's
    device: copied next to a CUDA network, CPU tensors fail at the first op."""
    device = net.head.weight.device
    x = torch.full((batch, length), net.mask_id, device=device)
    return x, torch.arange(batch * length, device=device).view(batch, length)


def reveal_probability(i: int, steps: int) -> float:
    """(t - s) / t of step i: the chance that a masked position is revealed."""
    t, s = 1 - i / steps, 1 - (i + 1) / steps
    return (t - s) / t


@torch.no_grad()
def mdlm_ddpd(net: TinyDenoiser, batch: int, length: int, steps: int, seed: int, temperature: float = 1.0,
              top_p: float | None = None) -> torch.Tensor:
    check_options(batch, length, steps, top_p)
    x, rows = all_mask(net, batch, length)
    for i in range(steps):
        masked = x == net.mask_id
        p = torch.full((batch, length, 1), reveal_probability(i, steps), device=x.device)  # a coin per position
        reveal = masked & bernoulli(p, seed=seed, offset=2 * i, row_ids=rows)[..., 0]
        if not reveal.any():
            continue
        hidden = net.hidden(x)[reveal]  # [n, H]: the head runs on these rows only
        controls = DrawControls(temperature=temperature, top_p=top_p)
        drawn = sample_from_hidden(hidden, net.head.weight, net.head.bias, controls=controls, seed=seed,
                                   offset=2 * i + 1, row_ids=rows[reveal])
        x[reveal] = drawn.tokens
    return x


def top_p_mask(logits: torch.Tensor, top_p: float, temperature: float) -> torch.Tensor:
    """Plain torch top-p as ddpd cuts: sort, cumulative softmax mass, keep the tokens whose
    mass above is < top_p (Hugging Face's sampler's cut), then every token tied with the
    last one kept. Hugging Face's code keeps only the tied tokens that the sort happens to
    put first; ddpd keeps the smallest upper set of logits whose mass reaches top_p, ties
    together, which is this: everything at or above the smallest logit kept. At temperature 0
    (greedy) ddpd cuts the law at temperature 1, and so does this."""
    probs = torch.softmax(logits / (temperature if temperature > 0 else 1.0), -1)
    sorted_probs, order = probs.sort(-1, descending=True)
    kept = (sorted_probs.cumsum(-1) - sorted_probs < top_p).sum(-1, keepdim=True)  # >= 1: a prefix
    smallest_kept = logits.gather(-1, order.gather(-1, kept - 1))
    return logits.masked_fill(logits < smallest_kept, float("-inf"))


def float32_logits(net: TinyDenoiser, x: torch.Tensor) -> torch.Tensor:
    """The logits [B, D, V] in float32 whatever the network's dtype, as sample_from_hidden
    computes them: with a bf16 network, net(x) rounded them to bf16 and 96 of 1280 rows
    (40 seeds of main's two settings) differed from the fused loop's."""
    return F.linear(net.hidden(x).float(), net.head.weight.float(), net.head.bias.float())


@torch.no_grad()
def mdlm_plain(net: TinyDenoiser, batch: int, length: int, steps: int, seed: int, temperature: float = 1.0,
               top_p: float | None = None) -> torch.Tensor:
    check_options(batch, length, steps, top_p)
    x, rows = all_mask(net, batch, length)
    vocab = net.head.out_features
    for i in range(steps):
        masked = x == net.mask_id
        u = philox_uniform(seed, 2 * i, rows.reshape(-1), 1).view(batch, length)  # column 0 of each row
        reveal = masked & (u.clamp(max=BELOW_ONE) < reveal_probability(i, steps))
        if not reveal.any():
            continue
        logits = float32_logits(net, x)[reveal]  # [n, V]
        if top_p is not None:
            logits = top_p_mask(logits, top_p, temperature)
        noise = philox_uniform(seed, 2 * i + 1, rows[reveal], noise_width(vocab))
        x[reveal] = reference.categorical(logits, temperature, noise).tokens
    return x


def main() -> None:
    # --help: this docstring
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    vocab, length, batch, steps = 50, 16, 4, 8
    net = TinyDenoiser(vocab, length)
    for kw in (dict(temperature=1.0), dict(temperature=0.8, top_p=0.9)):
        fused = mdlm_ddpd(net, batch, length, steps, seed=1, **kw)
        plain = mdlm_plain(net, batch, length, steps, seed=1, **kw)
        print(f"{kw}: same tokens from the same noise: {torch.equal(fused, plain)}")
        print(fused)


if __name__ == "__main__":
    main()
