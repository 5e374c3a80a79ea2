"""A tiny random denoiser for the examples: a one-layer bidirectional transformer over a
vocabulary of V tokens plus a mask id V, with the `hidden(x)` / `head` split that lets
ddpd.ops.sample_from_hidden apply the output head only at the rows being drawn. Its
weights are random (a fixed seed): the examples show the sampling loops, not a model."""
from typing import Optional

import torch
from torch import nn


class TinyDenoiser(nn.Module):
    def __init__(self, vocab_size: int, length: int, width: int = 32, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.mask_id = vocab_size
            self.embed = nn.Embedding(vocab_size + 1, width)
            self.position = nn.Parameter(0.1 * torch.randn(length, width))
            layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, dropout=0.0,
                                               batch_first=True)
            self.body = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
            self.head = nn.Linear(width, vocab_size)
            with torch.no_grad():
                self.head.weight.mul_(4.0)  # peaked enough that truncation and confidence matter

    def hidden(self, x: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Final hidden states [B, D, H] of tokens x [B, D] (mask id V allowed); attention_mask
        [B, D] (1 or True: a token, 0 or False: padding, never attended to), None: every token."""
        padding = None if attention_mask is None else ~attention_mask.bool()
        return self.body(self.embed(x) + self.position[: x.shape[1]], src_key_padding_mask=padding)

    def forward(self, x: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [B, D, V] over the clean tokens (never the mask)."""
        return self.head(self.hidden(x, attention_mask))
