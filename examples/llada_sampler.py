"""A LLaDA-style sampler with low-confidence remasking, written against ddpd.ops, beside
its plain-torch version.

The sampler (LLaDA's `generate`, one block): the answer starts all-mask after the
prompt; at each of `steps` steps the denoiser proposes a token at every masked position
(the argmax at temperature 0, LLaDA's default, else a draw at that temperature) with its
confidence, and the `k` masked positions of highest confidence are written
(k = answer length / steps, the remainder spread over the first steps); the others stay
masked for the next step.

- `llada_ddpd`: one call of ddpd.ops.sample_categorical per step draws every proposal
  and returns its confidence (`confidence="prob"`: the proposal's probability, under the
  softmax at temperature 1 when decoding greedily, as LLaDA computes it) from the same
  pass: no second log-softmax over [B, L, V].
- `llada_plain`: the same loop in plain torch, as LLaDA writes it: softmax over the full
  logits, the argmax (or the draw of ddpd.ops.categorical_reference, the categorical law of
  every ddpd path in plain torch, from the same counter-based uniforms), its probability
  gathered from the softmax. It returns the same tokens.
A difference from LLaDA worth knowing: at temperature > 0 LLaDA ranks the sampled tokens
by their probability at temperature 1; ddpd's confidence is their probability under the
law they were drawn from (tempered, truncated).

    python examples/llada_sampler.py
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tiny_networks import TinyDenoiser  # noqa: E402

from ddpd.ops import categorical_reference, noise_width, philox_uniform, sample_categorical  # noqa: E402


def transfer_counts(answer: int, steps: int) -> list[int]:
    """Positions written at each step: answer // steps, one more in the first answer % steps."""
    return [answer // steps + (i < answer % steps) for i in range(steps)]


def write_most_confident(x: torch.Tensor, proposal: torch.Tensor, confidence: torch.Tensor, masked: torch.Tensor,
                         k: int) -> torch.Tensor:
    """x with the k masked positions of highest confidence per row set to their proposal."""
    confidence = confidence.masked_fill(~masked, float("-inf"))
    chosen = confidence.topk(k, dim=1).indices
    return x.scatter(1, chosen, proposal.gather(1, chosen))


@torch.no_grad()
def llada_ddpd(net: TinyDenoiser, prompt: torch.Tensor, answer: int, steps: int, temperature: float = 0.0,
               seed: int = 0) -> torch.Tensor:
    batch = prompt.shape[0]
    x = torch.cat([prompt, torch.full((batch, answer), net.mask_id)], 1)
    rows = torch.arange(batch * x.shape[1]).view(batch, -1)  # one stream per position
    for i, k in enumerate(transfer_counts(answer, steps)):
        masked = x == net.mask_id
        proposal, _, confidence = sample_categorical(net(x), temperature, confidence="prob", seed=seed, offset=i,
                                                     row_ids=rows)
        x = write_most_confident(x, proposal, confidence, masked, k)
    return x


@torch.no_grad()
def llada_plain(net: TinyDenoiser, prompt: torch.Tensor, answer: int, steps: int, temperature: float = 0.0,
                seed: int = 0) -> torch.Tensor:
    batch = prompt.shape[0]
    x = torch.cat([prompt, torch.full((batch, answer), net.mask_id)], 1)
    rows = torch.arange(batch * x.shape[1])
    for i, k in enumerate(transfer_counts(answer, steps)):
        masked = x == net.mask_id
        logits = net(x)
        vocab = logits.shape[-1]
        if temperature == 0:
            proposal = logits.argmax(-1)
            probs = torch.softmax(logits, -1)
        else:
            noise = philox_uniform(seed, i, rows, noise_width(vocab))
            proposal = categorical_reference(logits.reshape(-1, vocab), temperature, noise)[0].view(batch, -1)
            probs = torch.softmax(logits / temperature, -1)
        confidence = probs.gather(-1, proposal[..., None]).squeeze(-1)
        x = write_most_confident(x, proposal, confidence, masked, k)
    return x


def main() -> None:
    # --help: this docstring
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    vocab, prompt_length, answer, steps = 50, 4, 12, 6
    net = TinyDenoiser(vocab, prompt_length + answer)
    prompt = torch.randint(0, vocab, (3, prompt_length), generator=torch.Generator().manual_seed(0))
    for temperature in (0.0, 0.7):
        fused = llada_ddpd(net, prompt, answer, steps, temperature, seed=2)
        plain = llada_plain(net, prompt, answer, steps, temperature, seed=2)
        print(f"temperature {temperature}: same tokens: {torch.equal(fused, plain)}")
        print(fused)


if __name__ == "__main__":
    main()
