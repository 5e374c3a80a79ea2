"""Mask-diffusion denoisers trained elsewhere, wrapped as ddpd mask denoisers.

ddpd's samplers call a mask denoiser as `denoiser(x: Long[B, D], t: Float[B]) ->
Float[B, D, V]`, the logits of p(x_1^d | x_t), with the mask id V at masked positions.
SEDD and MDLM put the mask at id V of a vocabulary of V + 1 and condition their network
on sigma = -log(alpha_t); the adapters turn their outputs into that callable:

- `SEDDAbsorbingDenoiser`: log-scores log s_j, and p(x_1^d = j | x_t) = expm1(sigma) s_j;
- `MDLMSubsDenoiser`: the SUBS logits, log_softmax over the V clean ids.

Unmasked positions get carry-over logits (one-hot at x_t^d). The derivation, the clamp
of alpha and how to load the released checkpoints are in docs/models.md ("Denoisers
trained elsewhere")."""
from __future__ import annotations

import contextlib
from typing import Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddpd.models.backbone import check_time, check_tokens
from ddpd.process import LinearSchedule, Schedule, get_schedule
from ddpd.validation import check_bool, check_float, check_int

CARRY_OVER_LOGIT = -1e6  # logit of the values an unmasked position cannot take
MIN_ALPHA = 1e-3  # 1 - the largest masked fraction of the log-linear noise of SEDD and MDLM (eps = 1e-3)
MAX_ALPHA = 1.0 - 1e-5  # sigma >= 1e-5, as at the end of their samplers


class MaskDenoiserAdapter(nn.Module):
    """Common part of the adapters: checks, time -> sigma, carry-over at unmasked positions.

    network: the wrapped nn.Module, called as network(x, sigma) with x: Long[B, D]
    (mask id V) and sigma: Float[B]; vocab_size: V clean symbols; schedule: the ddpd
    schedule the sampler uses (name or Schedule)."""

    def __init__(self, network: nn.Module, vocab_size: int, schedule: Union[str, Schedule] = LinearSchedule(),
                 min_alpha: float = MIN_ALPHA, max_alpha: float = MAX_ALPHA):
        super().__init__()
        if not callable(network):
            raise TypeError(f"network: expected a callable nn.Module, got {type(network).__name__}")
        self.network = network
        self.vocab_size = check_int("vocab_size", vocab_size, 1)
        self.schedule = get_schedule(schedule)
        self.min_alpha = check_float("min_alpha", min_alpha, 0.0, 1.0, open_min=True, open_max=True)
        self.max_alpha = check_float("max_alpha", max_alpha, self.min_alpha, 1.0, open_max=True)

    @property
    def mask_id(self) -> int:
        return self.vocab_size

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        """Total noise sigma = -log(alpha_t), Float[B], alpha clamped to [min_alpha, max_alpha].

        Args:
            t: Float[B] ddpd times in [0, 1].

        Returns:
            Float[B] total noise sigma.
        """
        alpha = self.schedule.alpha(t.double()).clamp(self.min_alpha, self.max_alpha)
        return (-torch.log(alpha)).float()

    def network_output(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """network(x, sigma) as float32 [B, D, V + 1] (a tensor, a `.logits` output or a tuple's first item).

        Args:
            x: Long[B, D] token ids, the mask id V at masked positions.
            sigma: Float[B] total noise.

        Returns:
            Float[B, D, V + 1] float32 output of the wrapped network.

        Raises:
            ValueError: the network's output has another shape, or is not floating-point.
        """
        with _autocast_like(self.network, x.device):
            out = self.network(x, sigma)
        if hasattr(out, "logits"):  # a Hugging Face ModelOutput
            out = out.logits
        elif isinstance(out, (tuple, list)) and out:
            out = out[0]
        expected = (*x.shape, self.vocab_size + 1)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"network: expected output of shape {list(expected)} (V + 1 = {self.vocab_size + 1} "
                             f"columns, the last one the mask), got {got}; is vocab_size={self.vocab_size} right?")
        if not out.is_floating_point():
            raise ValueError(f"network: expected floating-point log-scores or logits, got {out.dtype}")
        return out.float()

    def forward(self, x: torch.Tensor, t: Union[torch.Tensor, float]) -> torch.Tensor:
        """ddpd's mask denoiser: logits of p(x_1^d | x_t), one-hot at unmasked positions.

        Args:
            x: Long[B, D] token ids, the mask id V at masked positions.
            t: Float[B] ddpd times (or a number for every row).

        Returns:
            Float[B, D, V] float32 logits.
        """
        check_tokens(x, self.vocab_size + 1)
        t = check_time(t, x.shape[0], x.device)
        masked_logits = self.masked_logits(x, t)
        masked = (x == self.mask_id)[..., None]
        clean = x.clamp(max=self.vocab_size - 1)
        carry = torch.full_like(masked_logits, CARRY_OVER_LOGIT).scatter_(-1, clean[..., None], 0.0)
        return torch.where(masked, masked_logits, carry)

    def masked_logits(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Logits of p(x_1^d | x_t) [B, D, V], read at masked positions only.

        Args:
            x: Long[B, D] token ids, the mask id V at masked positions.
            t: Float[B] ddpd times.

        Returns:
            Float[B, D, V] float32 logits.

        Raises:
            NotImplementedError: always: the subclasses define it.
        """
        raise NotImplementedError(f"{type(self).__name__}.masked_logits: the subclasses of MaskDenoiserAdapter "
                                  "define it; wrap the network in SEDDAbsorbingDenoiser or MDLMSubsDenoiser, or in "
                                  "a subclass of your own that defines masked_logits")


def _autocast_like(network, device: torch.device):
    """Autocast to the precision of a network cast below float32 (prepare_for_sampling), where
    none is on already; nothing for a float32 network or a plain callable."""
    # the first cast parameter: a network's first may be a norm's, which stays float32
    parameters = network.parameters() if isinstance(network, nn.Module) else ()
    dtype = next((p.dtype for p in parameters if p.dtype in (torch.bfloat16, torch.float16)), None)
    if dtype is None or torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class SEDDAbsorbingDenoiser(MaskDenoiserAdapter):
    """A SEDD absorbing-state score network as a ddpd mask denoiser (docs/models.md).

    network(x, sigma) -> log-scores [B, D, V + 1]; logits = log s_j + log expm1(sigma)."""

    def masked_logits(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """log s_j + log expm1(sigma): log p(x_1^d = j | x_t) for an exact score.

        Args:
            x: Long[B, D] token ids, the mask id V at masked positions.
            t: Float[B] ddpd times.

        Returns:
            Float[B, D, V] float32 logits.
        """
        sigma = self.sigma(t)
        log_score = self.network_output(x, sigma)[..., :self.vocab_size]
        # log(e^sigma - 1) = sigma + log(1 - e^-sigma): no overflow for large sigma
        log_expm1 = sigma + torch.log(-torch.expm1(-sigma))
        return log_score + log_expm1[:, None, None]


class MDLMSubsDenoiser(MaskDenoiserAdapter):
    """An MDLM network (SUBS parameterisation) as a ddpd mask denoiser (docs/models.md).

    network(x, sigma) -> logits [B, D, V + 1]; logits = log_softmax of the V clean ones."""

    def __init__(self, network: nn.Module, vocab_size: int, schedule: Union[str, Schedule] = LinearSchedule(),
                 time_conditioning: bool = False, min_alpha: float = MIN_ALPHA, max_alpha: float = MAX_ALPHA):
        super().__init__(network, vocab_size, schedule, min_alpha, max_alpha)
        self.time_conditioning = check_bool("time_conditioning", time_conditioning)

    def masked_logits(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The SUBS logits without the mask column, log-softmax normalised.

        Args:
            x: Long[B, D] token ids, the mask id V at masked positions.
            t: Float[B] ddpd times (fed to the network only with time_conditioning).

        Returns:
            Float[B, D, V] float32 logits.
        """
        sigma = self.sigma(t)
        if not self.time_conditioning:
            sigma = torch.zeros_like(sigma)
        logits = self.network_output(x, sigma)[..., :self.vocab_size]  # the mask logit is -inf under SUBS
        return F.log_softmax(logits, dim=-1)
