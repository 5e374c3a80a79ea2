"""Small causal language model, the autoregressive baseline and a likelihood judge.

Input vocabulary V + 1: id V is a beginning-of-sequence token, so the judge also
scores the first token: log p(x) = sum_{d=0}^{D-1} log p(x_d | BOS, x_<d).
`forward(x)[:, d]` are the logits of token d + 1 given x_0..x_d.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ddpd.models.backbone import check_tokens
from ddpd.models.base import HeadModel, Labels, require_config
from ddpd.models.config import TransformerConfig


class ARModel(HeadModel):
    """ar(x: Long[B, D] in [0, V]) -> Float[B, D, V] next-token logits; BOS id = V.

    Train on `with_bos(x)` (length D + 1 <= max_seq_len) with `ar_loss` so the
    first-token distribution is learnt as well."""

    kind = "ar"

    def __init__(self, config: TransformerConfig):
        require_config(config, self.kind, vocab_size=lambda c: c.out_dim + 1, causal=True, time_conditioned=False)
        super().__init__(config)

    @property
    def bos_id(self) -> int:
        return self.config.out_dim

    def forward(self, x: torch.Tensor, *, labels: Labels = None) -> torch.Tensor:
        """Next-token logits of the causal model.

        Args:
            x: Long[B, D + 1] token ids, starting with BOS (with_bos adds it).
            labels: Long[B] class ids, an int, or None (the null label).

        Returns:
            Float[B, D + 1, V] float32 logits; position i predicts token i + 1.
        """
        return self.head(self.backbone.hidden(x, labels=labels)).float()

    def with_bos(self, x: torch.Tensor) -> torch.Tensor:
        """[BOS, x_0, ..., x_{D-1}]: Long[B, D + 1].

        Args:
            x: Long[B, D] clean token ids in [0, V).

        Returns:
            Long[B, D + 1], BOS first.

        Raises:
            TypeError: `x` is not an int64 tensor.
            ValueError: `x` is not of shape [B, D] or has an id out of [0, V).
        """
        check_tokens(x, self.bos_id)
        bos = torch.full((x.shape[0], 1), self.bos_id, dtype=x.dtype, device=x.device)
        return torch.cat((bos, x), dim=1)

    def log_likelihood(self, x: torch.Tensor, *, labels: Labels = None) -> torch.Tensor:
        """log p(x) in nats per sequence, Float[B], for clean sequences x: Long[B, D] in [0, V)
        with D <= max_seq_len - 1: the last position is never trained to predict (ar_loss
        on with_bos(x) of length max_seq_len), so a longer x would be scored by it.

        Args:
            x: Long[B, D] clean token ids in [0, V).
            labels: Long[B] class ids, an int, or None (the null label).

        Returns:
            Float[B], log p(x) in nats per sequence.

        Raises:
            TypeError: `x` is not an int64 tensor.
            ValueError: `x` is not [B, D], has an id out of [0, V), or D > max_seq_len - 1.
        """
        check_tokens(x, self.bos_id)
        if x.shape[1] > self.config.max_seq_len - 1:
            raise ValueError(f"x: expected sequence length in [1, max_seq_len - 1 = {self.config.max_seq_len - 1}] "
                             f"(one position holds BOS), got {x.shape[1]}")
        logits = self.forward(self.with_bos(x)[:, :-1], labels=labels)
        log_probs = F.log_softmax(logits.float(), dim=-1)
        return log_probs.gather(-1, x[:, :, None]).squeeze(-1).sum(-1)
