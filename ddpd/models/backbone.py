"""Pre-norm transformer trunk shared by the planner, the denoisers and the AR judge.

tokens -> embedding -> n_layers x [x + attn(norm(x)), x + mlp(norm(x))] -> final norm,
giving hidden states [B, D, H] that a network's output head turns into logits.

Conditioning is adaLN-Zero: the time t (when `time_conditioned`) and a class label y
(when `num_classes > 0`; label C is the null label) give each sub-layer a shift, scale
and gate that start at zero. The planner is built without time input (paper, appendix
'Implementation details'). Call `hidden(x, t, labels=y)`; labels=None is the null label.

docs/models.md ("The trunk", "Class labels", "Precision") has the details."""
from __future__ import annotations

import math
import numbers
import operator
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddpd.models.attention import SelfAttention
from ddpd.models.config import TransformerConfig
from ddpd.ops.norm import normalize
from ddpd.validation import value_range, values_checkable

INIT_STD = 0.02
TIME_FREQ_DIM = 256
TIME_SCALE = 1000.0  # spreads t in [0, 1] over the sinusoid periods


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm with its statistics in float32 for bf16/fp16 inputs (identical for float32),
    and the adaLN modulation n * (1 + scale) + shift when given, rounded once (ddpd.ops.norm:
    one kernel on CUDA when no gradient is needed, the torch code otherwise)."""

    def forward(self, x: torch.Tensor, shift: Optional[torch.Tensor] = None,
                scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The normalised x, modulated by shift and scale when given.

        Args:
            x: [..., dim] inputs.
            shift: the adaLN shift, broadcast against x, or None.
            scale: the adaLN scale, broadcast against x, or None.

        Returns:
            A tensor like `x`.
        """
        return normalize(x, self.weight, self.bias, self.eps, False, shift, scale)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight in float32, modulated like LayerNorm."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, shift: Optional[torch.Tensor] = None,
                scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The normalised x, modulated by shift and scale when given.

        Args:
            x: [..., dim] inputs.
            shift: the adaLN shift, broadcast against x, or None.
            scale: the adaLN scale, broadcast against x, or None.

        Returns:
            A tensor like `x`.
        """
        return normalize(x, self.weight, None, self.eps, True, shift, scale)


def make_norm(kind: str, dim: int) -> nn.Module:
    """The trunk's norm layer of `kind`.

    Args:
        kind: "rmsnorm", or anything else for LayerNorm (TransformerConfig.norm is checked).
        dim: the feature width.

    Returns:
        An RMSNorm or LayerNorm module.
    """
    return RMSNorm(dim) if kind == "rmsnorm" else LayerNorm(dim)


def timestep_embedding(t: torch.Tensor, dim: int = TIME_FREQ_DIM, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features [B, dim] of TIME_SCALE * t for t: Float[B].

    Args:
        t: Float[B] times.
        dim: the number of features (even).
        max_period: the longest sinusoid period.

    Returns:
        Float[B, dim] float32 features.
    """
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = TIME_SCALE * t.float()[:, None] * freqs[None, :]
    return torch.cat((args.cos(), args.sin()), dim=-1)


class TimeEmbedding(nn.Module):
    """t -> float32 sinusoid -> MLP -> [B, d_model], added into the conditioning vector before its silu."""

    def __init__(self, d_model: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(TIME_FREQ_DIM, d_model), nn.SiLU(), nn.Linear(d_model, d_model))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """The time embedding of t.

        Args:
            t: Float[B] times.

        Returns:
            [B, d_model] in the dtype of the weights.
        """
        features = timestep_embedding(t)
        return self.mlp(features.to(self.mlp[0].weight.dtype))


class MLP(nn.Module):
    def __init__(self, d_model: int, ratio: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(d_model, ratio * d_model, bias=False)
        self.proj = nn.Linear(ratio * d_model, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's feed-forward branch, GELU between two projections.

        Args:
            x: [B, D, d_model].

        Returns:
            [B, D, d_model].
        """
        return self.dropout(self.proj(F.gelu(self.fc(x))))


def _gated_residual(x: torch.Tensor, gate: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """x + gate * branch. On CUDA one addcmul kernel (one pass over the trunk instead of two,
    the product no longer rounded apart); the CPU keeps the two operations, whose float32
    roundings the pinned sampling tests fix."""
    if x.is_cuda:
        return torch.addcmul(x, gate, branch)
    return x + gate * branch


class Block(nn.Module):
    """Pre-norm transformer block, adaLN-modulated when a conditioning vector is given."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm1 = make_norm(config.norm, config.d_model)
        self.attn = SelfAttention(config.d_model, config.n_heads, config.max_seq_len, config.causal, config.dropout)
        self.norm2 = make_norm(config.norm, config.d_model)
        self.mlp = MLP(config.d_model, config.mlp_ratio, config.dropout)
        self.modulation = nn.Linear(config.d_model, 6 * config.d_model) if config.conditioned else None

    def forward(self, x: torch.Tensor, c: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x + attention + MLP, each sub-layer gated and modulated by c when the block is conditioned.

        Args:
            x: [B, D, d_model] residual stream.
            c: [B, d_model] conditioning vector, or None.

        Returns:
            [B, D, d_model].
        """
        if self.modulation is None:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c)[:, None, :].chunk(6, dim=-1)
        x = _gated_residual(x, gate1, self.attn(self.norm1(x, shift1, scale1)))
        return _gated_residual(x, gate2, self.mlp(self.norm2(x, shift2, scale2)))


def check_tokens(x: torch.Tensor, vocab_size: int, max_seq_len: Optional[int] = None) -> None:
    """Validate x: Long[B, D] with D >= 1 (and <= max_seq_len when given) and ids in [0, vocab_size).

    The id range is checked on CPU only (on CUDA it would cost a host sync per call), and
    not while traced (torch.compile: a graph break per call; make_fx, vmap: no values).

    Args:
        x: the token ids, expected Long[B, D].
        vocab_size: ids must lie in [0, vocab_size).
        max_seq_len: the longest D allowed; None for no limit.

    Raises:
        TypeError: `x` is not an int64 tensor.
        ValueError: `x` has another shape, length or an id out of range.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor of token ids, got {type(x).__name__}")
    if x.dtype != torch.long:
        raise TypeError(f"x: expected dtype torch.int64, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: expected shape [B, D], got {tuple(x.shape)}")
    if max_seq_len is None and x.shape[1] < 1:
        raise ValueError(f"x: expected sequence length >= 1, got {x.shape[1]}")
    if max_seq_len is not None and not 1 <= x.shape[1] <= max_seq_len:
        raise ValueError(f"x: expected sequence length in [1, max_seq_len={max_seq_len}], got {x.shape[1]}")
    if values_checkable(x):
        low, high = value_range(x)
        if low < 0 or high >= vocab_size:
            raise ValueError(f"x: expected token ids in [0, {vocab_size}), got range [{low}, {high}]")


def check_time(t: Union[torch.Tensor, float], batch: int, device: torch.device) -> torch.Tensor:
    """Validate t (Float[B], a 0-d tensor or a number, in [0, 1]) and return it as Float[B]
    on device. The range is checked for numbers and CPU tensors only (on CUDA it would cost
    a host sync per call), and not while traced (ddpd.validation.readable).

    Args:
        t: Float[B] times in [0, 1], or a number for every row.
        batch: B.
        device: where the network runs.

    Returns:
        Float[B] times.

    Raises:
        TypeError: `t` is neither a float tensor nor a number.
        ValueError: `t` has another shape or a time outside [0, 1].
    """
    if isinstance(t, numbers.Real) and not isinstance(t, bool):  # numpy scalars too (float32 is no float)
        _check_time_range(float(t), float(t))
        return torch.full((batch,), float(t), device=device)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t: expected a float tensor of shape [B] or a number, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"t: expected a floating-point tensor, got {t.dtype}")
    if t.dim() != 0 and t.shape != (batch,):
        raise ValueError(f"t: expected shape [{batch}] (one time per sequence), got {tuple(t.shape)}")
    if values_checkable(t):
        _check_time_range(*value_range(t))  # min and max are NaN where any t is
    return t.expand(batch).to(device) if t.dim() == 0 else t.to(device)


def _check_time_range(low: float, high: float) -> None:
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"t: expected times in [0, 1], got range [{low}, {high}]")


def check_labels(labels: Optional[Union[torch.Tensor, int]], batch: int, num_classes: int,
                 device: torch.device) -> Optional[torch.Tensor]:
    """Validate class labels and return them as Long[B] on device (None for a model
    without classes). labels: Long[B] or an int in [0, num_classes], num_classes being
    the null label; None means the null label for every row. The range is checked on
    CPU only (on CUDA it would cost a host sync per call).

    Args:
        labels: Long[B] class ids in [0, num_classes], an int for every row (numpy's integers too), or None.
        batch: B.
        num_classes: the network's classes (0: not class-conditional).
        device: where the network runs.

    Returns:
        Long[B] labels, or None.

    Raises:
        TypeError: `labels` is neither an int64 tensor, an int nor None.
        ValueError: labels given to a network without classes, or of another shape or range.
    """
    if num_classes == 0:
        if labels is not None:
            raise ValueError("labels: this model is not class-conditional (num_classes=0), expected None, "
                             f"got {type(labels).__name__}")
        return None
    if labels is None:
        return torch.full((batch,), num_classes, dtype=torch.long, device=device)
    if isinstance(labels, numbers.Integral) and not isinstance(labels, bool):  # numpy's integers too
        labels = operator.index(labels)
        if not 0 <= labels <= num_classes:
            raise ValueError(f"labels: expected class ids in [0, {num_classes}] ({num_classes} = null), got {labels}")
        return torch.full((batch,), labels, dtype=torch.long, device=device)
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels: expected a torch.int64 tensor of shape [{batch}], an int or None, "
                        f"got {type(labels).__name__}")
    if labels.dtype != torch.long:
        raise TypeError(f"labels: expected dtype torch.int64, got {labels.dtype}")
    if labels.shape != (batch,):
        raise ValueError(f"labels: expected shape [{batch}] (one label per sequence), got {tuple(labels.shape)}")
    if values_checkable(labels):
        low, high = value_range(labels)
        if low < 0 or high > num_classes:
            raise ValueError(f"labels: expected class ids in [0, {num_classes}] ({num_classes} = null), "
                             f"got range [{low}, {high}]")
    return labels.to(device)


def init_linear(module: nn.Module, std: float = INIT_STD) -> None:
    """GPT-2 initialisation: N(0, std) weights, zero biases.

    Args:
        module: any module; only nn.Linear and nn.Embedding are changed.
        std: the weights' standard deviation.
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class Backbone(nn.Module):
    """Token embedding + transformer blocks + final norm; `hidden(x, t)` -> [B, D, d_model]."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config: expected TransformerConfig, got {type(config).__name__}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.time_embed = TimeEmbedding(config.d_model) if config.time_conditioned else None
        # row num_classes is the null label of classifier-free guidance
        self.label_embed = nn.Embedding(config.num_classes + 1, config.d_model) if config.num_classes else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = make_norm(config.norm, config.d_model)
        self.final_modulation = nn.Linear(config.d_model, 2 * config.d_model) if config.conditioned else None
        self._init_weights()

    def _init_weights(self) -> None:
        self.apply(init_linear)
        # residual branches add up over 2 * n_layers sub-layers (GPT-2)
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=residual_std)
            if block.modulation is not None:
                nn.init.zeros_(block.modulation.weight)
                nn.init.zeros_(block.modulation.bias)
        if self.final_modulation is not None:
            nn.init.zeros_(self.final_modulation.weight)
            nn.init.zeros_(self.final_modulation.bias)

    def condition(self, x: torch.Tensor, t: Optional[Union[torch.Tensor, float]],
                  labels: Optional[Union[torch.Tensor, int]]) -> Optional[torch.Tensor]:
        """The adaLN conditioning vector c [B, d_model] (None for an unconditioned trunk).

        Args:
            x: Long[B, D] token ids (for the batch size and device).
            t: Float[B] times, a number, or None.
            labels: Long[B] class ids, an int, or None.

        Returns:
            Float[B, d_model], or None.

        Raises:
            ValueError: a time-conditioned trunk got no `t`, or `t` / `labels` are invalid.
        """
        batch = x.shape[0]
        labels = check_labels(labels, batch, self.config.num_classes, x.device)
        terms = []
        if self.time_embed is not None:
            if t is None:
                raise ValueError("t: this model is time-conditioned, expected Float[B] times, got None")
            terms.append(self.time_embed(check_time(t, batch, x.device)))
        if labels is not None:
            terms.append(self.label_embed(labels))
        if not terms:
            return None
        return F.silu(terms[0] if len(terms) == 1 else terms[0] + terms[1])

    def hidden(self, x: torch.Tensor, t: Optional[Union[torch.Tensor, float]] = None, *,
               labels: Optional[Union[torch.Tensor, int]] = None) -> torch.Tensor:
        """Hidden states after the final norm, [B, D, d_model], in the weights' dtype.

        t is required when the config is time-conditioned and ignored otherwise (so a
        sampler can pass t to any denoiser). labels: Long[B] class ids in
        [0, num_classes] or None (the null label) for a class-conditional config; must
        be None otherwise.

        Args:
            x: Long[B, D] token ids in [0, config.vocab_size).
            t: Float[B] times in [0, 1] or a number.
            labels: Long[B] class ids, an int, or None.

        Returns:
            [B, D, d_model] hidden states.

        Raises:
            TypeError, ValueError: `x`, `t` or `labels` of the wrong type, shape or range.
        """
        check_tokens(x, self.config.vocab_size, self.config.max_seq_len)
        c = self.condition(x, t, labels)
        h = self.dropout(self.embed(x))
        for block in self.blocks:
            h = block(h, c)
        if c is None:
            return self.final_norm(h)
        shift, scale = self.final_modulation(c)[:, None, :].chunk(2, dim=-1)
        return self.final_norm(h, shift, scale)

    forward = hidden
