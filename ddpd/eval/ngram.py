"""A character n-gram judge: interpolated absolute discounting (Ney, Essen and Kneser 1994).

P(w | h) = (max(c(h w) - d, 0) + d N1+(h .) P(w | h')) / c(h .), h' = h without its first
token, down to an add-one unigram; a context never seen backs off whole. It scores samples
like the autoregressive judge (`log_likelihood`, nats per sequence), builds in seconds from
a corpus on the CPU, and knows nothing of the diffusion models it judges.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ddpd.eval.checks import check_float, check_int, check_tokens

MAX_ORDER = 12  # the longest n-gram a judge counts


class NGramJudge:
    """An order-`order` n-gram model of token ids in [0, vocab_size).

    Args:
        tokens: Long[N], the training text as token ids.
        vocab_size: the number of token ids.
        order: n, the longest n-gram (>= 1).
        discount: d in (0, 1).

    Raises:
        TypeError: tokens not an int64 tensor, or discount not a number.
        ValueError: a bad order, discount or token id.
    """

    def __init__(self, tokens: Tensor, vocab_size: int, order: int = 6, discount: float = 0.75):
        self.vocab_size = check_int("vocab_size", vocab_size, 2)
        self.order = check_int("order", order, 1, MAX_ORDER)
        self.discount = check_float("discount", discount, 0.0, 1.0, open_min=True, open_max=True)
        import numpy as np  # imported where used: numpy is not needed to import ddpd

        if not isinstance(tokens, Tensor):
            raise TypeError(f"tokens must be a torch.Tensor of token ids, got {type(tokens).__name__}")
        if tokens.dtype != torch.long:  # float or bool ids would be truncated and counted
            raise TypeError(f"tokens must have dtype torch.int64, got {tokens.dtype}")
        ids = tokens.cpu().numpy()
        if ids.ndim != 1 or ids.size <= order:
            raise ValueError(f"tokens must be more than {order} ids in [0, {vocab_size}), got shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= vocab_size:  # the shape alone named no fault here
            raise ValueError(f"tokens must be ids in [0, {vocab_size}), got range [{ids.min()}, {ids.max()}]")
        if ids.size * vocab_size >= 2**62:  # a key is below N V
            raise ValueError(f"tokens.numel() * vocab_size must fit 62 bits, got {ids.size} * {vocab_size}")
        unigram = np.bincount(ids, minlength=vocab_size).astype(np.float64) + 1.0
        self.unigram = unigram / unigram.sum()
        self.tables: list[tuple] = []
        prefix = ids  # at each position, the rank of the (m - 1)-gram starting there; at m = 2 its token
        for m in range(2, order + 1):
            table, prefix = self._table(prefix, ids, m)
            self.tables.append(table)

    def _table(self, prefix, ids, m: int) -> tuple:
        """(m-gram keys, their counts, context keys, c(h .), N1+(h .)) with keys sorted, and the
        rank of the m-gram at each position. An m-gram's key is its context's rank times V plus
        its last token: below N V at any order, where its ids in base V would overflow int64."""
        import numpy as np

        keys = prefix[:ids.size - m + 1] * self.vocab_size + ids[m - 1:]
        grams, ranks, counts = np.unique(keys, return_inverse=True, return_counts=True)
        contexts, first, followers = np.unique(grams // self.vocab_size, return_index=True, return_counts=True)
        return (grams, counts, contexts, np.add.reduceat(counts, first), followers), ranks.reshape(-1)

    def log_likelihood(self, x: Tensor) -> Tensor:
        """Float[B]: log p(x_b) in nats of each row of x (Long[B, D]), the first token by the
        unigram, each next by the longest context available.

        Args:
            x: Long[B, D] tokens.

        Returns:
            Float[B] nats per sequence.

        Raises:
            TypeError: x not an int64 tensor.
            ValueError: x not [B, D] with B, D >= 1, or an id outside [0, vocab_size).
        """
        import numpy as np

        # checked on the CPU, where check_tokens checks the ids' range too
        ids = check_tokens("x", x.cpu() if isinstance(x, Tensor) else x, self.vocab_size).numpy()
        p = self.unigram[ids]
        rank = ids  # of each position's (m - 1)-gram among the corpus's, -1 where it has none
        for m, (grams, counts, contexts, totals, followers) in zip(range(2, self.order + 1), self.tables):
            if ids.shape[1] < m:
                break
            h = rank[:, :ids.shape[1] - m + 1]
            key = np.where(h >= 0, h * self.vocab_size + ids[:, m - 1:], -1)  # -1: no key, counts 0
            c_hw = _lookup(grams, counts, key)
            c_h = _lookup(contexts, totals, h)
            n_h = _lookup(contexts, followers, h)
            rank = _rank(grams, key)
            lower = p[:, m - 1:]
            seen = c_h > 0
            mixed = (np.maximum(c_hw - self.discount, 0.0) + self.discount * n_h * lower) / np.maximum(c_h, 1)
            p = np.concatenate([p[:, :m - 1], np.where(seen, mixed, lower)], 1)
        return torch.from_numpy(np.log(p).sum(1))


def _lookup(keys, values, query):
    """values at query's positions in the sorted keys (numpy arrays), 0 where a query is not among them."""
    import numpy as np

    at = _rank(keys, query)
    return np.where(at >= 0, values[at], 0).astype(np.float64)


def _rank(keys, query):
    """The index of each query in the sorted keys (numpy arrays), -1 where it is not among them."""
    import numpy as np

    at = np.clip(np.searchsorted(keys, query), 0, keys.size - 1)
    return np.where(keys[at] == query, at, -1)
