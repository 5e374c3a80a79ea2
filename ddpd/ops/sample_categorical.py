"""One token per row from logits [..., V] without writing a softmax: the denoising draw
j ~ Cat(p_{1|t}(x_1^d = j | x_t, z_t^d = N)) of Algorithm `alg:sampling` (prop:self-loop-jumps)
and the token draw of MDLM, LLaDA, Dream and MaskGIT samplers, with their controls
(temperature, top_k, top_p, min_p, excluded and allowed tokens: DrawControls) and the drawn
token's log-probability or confidence from the same pass.

Method: an exact two-level Gumbel-max over tiles of TILE tokens, each comparison relative to a
maximum so that no scale of logits or temperature loses the noise; truncation thresholds by a
radix search, no sort. `categorical_reference` is the law in plain torch from explicit noise.
Uniforms: column j drives token j, column V + t tile t (noise_width(V) a row).
CPU tensors run csrc/cpu/sample_categorical.cpp, CUDA tensors ddpd.kernels.sample_categorical;
traced calls go through the custom op ddpd::sample_categorical.
The law, the truncation rules and the method: docs/ops/sample_categorical.md.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import operator
from typing import Optional

import torch

from ddpd.ops import _dispatch, rng
from ddpd.ops.controls import DrawControls
from ddpd.ops.results import Draw
from ddpd.validation import check_float, check_same_device, check_tensor, values_checkable

TILE = 256
CONFIDENCES = ("prob", "margin", "entropy")  # codes 1, 2, 3 in the kernels
LOGIT_DTYPES = _dispatch.FLOAT_DTYPES + (torch.float64,)
GREEDY = -1.0  # the temperature the kernels read for a greedy row (temperature 0)
# The largest temperature (and planner tau): up to it a logit spread that overflows float32
# (a - b = -inf in shifted) has weight exp(-3.4e38 / T) = 0 in float32, so every path is
# exact; much above it a temperature rounds to +inf in float32 and the shift is NaN.
MAX_TEMPERATURE = 1e36
FLOAT32_MAX = 3.4028234663852886e38  # (2 - 2**-23) * 2**127
TEMPERATURE_RANGE = f"in [0, {MAX_TEMPERATURE:g}] (0: greedy)"  # built once: torch.compile traces no format spec
THRESHOLD_BLOCK = 1024  # logits per step of the Triton threshold search
THRESHOLD_SCAN_BLOCK = 4096  # logits per step of its plain passes (maximum, masses, compaction)
# 8 warps, 4 logits a thread: with its 32-bit keys the 16-bucket search then keeps every
# value in registers on sm_90 under Triton 3.6 and 3.9 (with 4 warps it spills; with 16,
# Triton 3.9 caps it at 64 registers and spills; tests/ops/test_op_kernel_resources.py)
THRESHOLD_WARPS = 8
# top-k's bound: the row's logits in groups (at least GROUP_MIN, at most MAX_GROUPS groups);
# the k-th largest group maximum is at most the k-th largest logit, and the logits at or
# above it (typically a few times k) are copied out, up to CANDIDATES of them, so that
# the search passes read those instead of the row (a scratch of 11-16 KiB a row, beside
# 100-250 KiB of bf16 logits at GPT-2's and Llama 3's vocabularies)
GROUP_MIN, MAX_GROUPS, CANDIDATES = 64, 2048, 2048
# top-p's candidates, the logits above the tightest cut of kernels.sample_categorical.top_p_cut
# (its nucleus, often hundreds of random logits, and the cut's margin): room for more (32 KiB
# a row of scratch)
TOP_P_CANDIDATES = 8192


def n_tiles(vocab_size: int) -> int:
    """The number of TILE-token tiles a row of vocab_size tokens spans.

    Args:
        vocab_size: V.

    Returns:
        ceil(V / TILE).
    """
    return -(-vocab_size // TILE)


def noise_width(vocab_size: int) -> int:
    """Uniforms per row that explicit `noise` of a draw over vocab_size tokens must hold.

    Args:
        vocab_size: V, an int >= 1 (numpy's integers too).

    Returns:
        V token uniforms plus one a tile of TILE tokens, a Python int.

    Raises:
        ValueError: vocab_size is not an int >= 1.
    """
    # numbers.Integral holds numpy's integers, not bools, floats or tensors
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")
    vocab_size = operator.index(vocab_size)
    return vocab_size + n_tiles(vocab_size)


# ----------------------------------------------------------------------------- checks


@dataclasses.dataclass(frozen=True)
class Controls:
    """The sampling controls of a call as the kernels read them, each a scalar for every
    row or a per-row tensor [N]: temperature (float32; GREEDY for temperature 0), top_k
    (int64; 0 = off), top_p (float32; 1 = off), log_min_p (float32 log of min_p; -inf =
    off)."""
    temperature: float = 1.0
    temperature_t: Optional[torch.Tensor] = None
    top_k: int = 0
    top_k_t: Optional[torch.Tensor] = None
    top_p: float = 1.0
    top_p_t: Optional[torch.Tensor] = None
    log_min_p: float = -math.inf
    log_min_p_t: Optional[torch.Tensor] = None

    @property
    def truncates(self) -> bool:
        return any(truncation_flags(self.top_k, self.top_k_t, self.top_p, self.top_p_t, self.log_min_p,
                                    self.log_min_p_t))

    def per_row(self, rows: int, device: torch.device) -> tuple:
        """Every control as a tensor, one value a row.

        Args:
            rows: N, the rows of the call.
            device: the device of the tensors made from scalars.

        Returns:
            (temperature Float32[N], top_k Long[N], top_p Float32[N], log_min_p Float32[N]).
        """
        def full(scalar, tensor, dtype):
            return tensor if tensor is not None else torch.full((rows,), scalar, dtype=dtype, device=device)

        return (full(self.temperature, self.temperature_t, torch.float32), full(self.top_k, self.top_k_t, torch.int64),
                full(self.top_p, self.top_p_t, torch.float32), full(self.log_min_p, self.log_min_p_t, torch.float32))


def float32(value: float) -> float:
    """value rounded to float32 (every path then compares the same number).

    Args:
        value: a float.

    Returns:
        The float32 value, as a Python float.
    """
    if value == 0.0 or not math.isfinite(value):
        return value
    # In math, not struct.pack: torch.compile before torch 2.9 cannot trace struct's C functions.
    mantissa, exponent = math.frexp(value)
    bits = min(24, exponent + 149)  # float32 keeps 24 significant bits, none below 2**-149
    nearest = math.ldexp(round(math.ldexp(mantissa, bits)), exponent - bits)  # round() ties to even
    return math.copysign(nearest if abs(nearest) <= FLOAT32_MAX else math.inf, value)


def symbolic(value) -> bool:
    """A number traced by torch.compile: passed through, its value is not known here.

    Args:
        value: a control as given.

    Returns:
        True for a SymInt or SymFloat.
    """
    return isinstance(value, (torch.SymInt, torch.SymFloat))


def per_row_tensor(name: str, value: torch.Tensor, lead: tuple, like: torch.Tensor, dtypes,
                   like_name: str = "logits") -> torch.Tensor:
    """A per-row control given as a tensor: of the leading shape, or 0-d (every row).

    Args:
        name: the argument's name, for the message.
        value: the tensor given.
        lead: the leading shape of the input (its rows).
        like: the input, whose device value must share.
        dtypes: the allowed dtypes.
        like_name: the input's argument name, for the message.

    Returns:
        The values flat [N], contiguous (the kernels read element r for row r).

    Raises:
        TypeError: a tensor of another dtype.
        ValueError: another shape or device.
    """
    check_tensor(name, value, dtypes)
    if value.dim() != 0 and tuple(value.shape) != tuple(lead):
        raise ValueError(f"{name} must be a number, a 0-d tensor or a tensor of the leading shape {tuple(lead)} "
                         f"(one value per row), got shape {tuple(value.shape)}")
    check_same_device(name, value, like, like_name)
    rows = math.prod(lead)
    return (value.expand(lead) if value.dim() == 0 else value).reshape(rows).contiguous()


def check_values(name: str, value: torch.Tensor, ok: torch.Tensor, expected: str) -> None:
    """Range check of a per-row control: on CPU tensors outside tracing only (elsewhere it
    would wait for the device or guard on data).

    Args:
        name: the argument's name, for the message.
        value: the control's values [N].
        ok: Bool[N], which values are in range.
        expected: the range, for the message.

    Raises:
        ValueError: a CPU value out of range outside tracing.
    """
    if values_checkable(value) and not bool(ok.all()):
        bad = value[~ok][0].item()
        raise ValueError(f"{name} values must be {expected}, got {bad}")


FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@functools.lru_cache(maxsize=64)
def usual_controls(temperature: float) -> Controls:
    """The controls of a call with only a temperature, made once a value: a cache lookup
    costs a call less host time than building the frozen dataclass.

    Args:
        temperature: a float in (0, MAX_TEMPERATURE].

    Returns:
        Controls(temperature=temperature).
    """
    return Controls(temperature=temperature)


def check_controls(temperature, top_k, top_p, min_p, lead: tuple, like: torch.Tensor,
                   like_name: str = "logits") -> Controls:
    """Validate the sampling controls (numbers, or tensors of the leading shape).

    Args:
        temperature, top_k, top_p, min_p: the op's arguments of these names.
        lead: the leading shape of the input (its rows).
        like: the input, whose device tensor controls must share.
        like_name: the input's argument name, for the messages.

    Returns:
        The Controls the kernels read.

    Raises:
        TypeError: a control of the wrong type.
        ValueError: a control out of range, or a tensor of another shape or device.
    """
    if type(temperature) is float and 0.0 < temperature <= MAX_TEMPERATURE and top_k is None and top_p is None \
            and min_p is None:
        # the usual call, checked in one line (host cost); traced, without the cache (Dynamo
        # warns that it traces through an lru_cache)
        return Controls(temperature=temperature) if torch.compiler.is_compiling() else usual_controls(temperature)
    c = {}
    if isinstance(temperature, torch.Tensor):
        t = per_row_tensor("temperature", temperature, lead, like, FLOATS, like_name)
        wide = t.double()  # in float16 the bound 1e36 is inf: an inf temperature would pass
        check_values("temperature", t, (wide >= 0) & (wide <= MAX_TEMPERATURE), TEMPERATURE_RANGE)
        c["temperature_t"] = torch.where(t > 0, t.float(), GREEDY)
    elif symbolic(temperature):
        c["temperature"] = temperature
    else:
        t = check_float("temperature", temperature, 0.0, MAX_TEMPERATURE)
        c["temperature"] = GREEDY if t == 0 else t
    if top_k is not None:
        if isinstance(top_k, torch.Tensor):
            k = per_row_tensor("top_k", top_k, lead, like, INTS, like_name)
            check_values("top_k", k, k >= 0, ">= 0 (0: off)")
            c["top_k_t"] = k.long()
        elif not symbolic(top_k):
            if isinstance(top_k, bool) or not hasattr(top_k, "__index__"):
                raise TypeError(f"top_k must be an int or an integer tensor, got {type(top_k).__name__} {top_k!r}")
            k = operator.index(top_k)
            if k < 0:
                raise ValueError(f"top_k must be >= 0 (0: off), got {k}")
            c["top_k"] = min(k, 2**62)  # at or above the number of tokens it is off; the kernels take int64
        else:
            c["top_k"] = top_k
    if top_p is not None:
        if isinstance(top_p, torch.Tensor):
            p = per_row_tensor("top_p", top_p, lead, like, FLOATS, like_name)
            check_values("top_p", p, (p > 0) & (p <= 1), "in (0, 1] (1: off)")
            c["top_p_t"] = p.float()
        else:
            c["top_p"] = float32(check_float("top_p", top_p, 0.0, 1.0, open_min=True))
    if min_p is not None:
        if isinstance(min_p, torch.Tensor):
            m = per_row_tensor("min_p", min_p, lead, like, FLOATS, like_name)
            check_values("min_p", m, (m >= 0) & (m <= 1), "in [0, 1] (0: off)")
            c["log_min_p_t"] = torch.log(m.double()).float()
        else:
            m = check_float("min_p", min_p, 0.0, 1.0)
            c["log_min_p"] = float32(math.log(m)) if m > 0 else -math.inf
    return Controls(**c)


def check_token_ids(exclude_ids, like: torch.Tensor, vocab_size: int,
                    like_name: str = "logits") -> Optional[torch.Tensor]:
    """exclude_ids as an int64 tensor on like's device: a sequence of ints (numpy integers too)
    is range-checked here and cached on the device; a tensor is checked by the kernels (CPU).

    Args:
        exclude_ids: the op's `exclude_ids`: None, a sequence of ints or an integer tensor [m].
        like: the input, whose device the ids go to.
        vocab_size: V.
        like_name: the input's argument name, for the message.

    Returns:
        Long[m] on like's device, or None when there are none.

    Raises:
        TypeError: not a sequence of ints or an integer tensor.
        ValueError: an int outside [0, V), or a tensor not 1-d or on another device.
    """
    if exclude_ids is None:
        return None
    if isinstance(exclude_ids, torch.Tensor):
        check_tensor("exclude_ids", exclude_ids, INTS, 1)
        check_same_device("exclude_ids", exclude_ids, like, like_name)
        return exclude_ids.long().contiguous() if exclude_ids.numel() else None
    if isinstance(exclude_ids, (str, bytes)) or not hasattr(exclude_ids, "__iter__"):
        raise TypeError("exclude_ids must be a sequence of ints or an integer tensor, got "
                        f"{type(exclude_ids).__name__}")
    ids = []
    for i in exclude_ids:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError(f"exclude_ids[] must be ints, got {type(i).__name__} {i!r}")
        i = operator.index(i)
        if not 0 <= i < vocab_size:
            raise ValueError(f"exclude_ids[] must be in [0, {vocab_size - 1}], got {i}")
        ids.append(i)
    return _dispatch.device_ids(tuple(ids), like.device) if ids else None


def check_masks(exclude_ids, exclude_per_row, allowed, lead: tuple, like: torch.Tensor, vocab_size: int,
                like_name: str = "logits") -> tuple:
    """Validate the token masks of a call.

    Args:
        exclude_ids: the op's `exclude_ids`.
        exclude_per_row: the op's `exclude_per_row`: Long of the leading shape, or None.
        allowed: the op's `allowed`: Bool of the leading shape + [V], or None.
        lead: the leading shape of the input (its rows).
        like: the input, whose device the masks must share.
        vocab_size: V.
        like_name: the input's argument name, for the messages.

    Returns:
        (exclude_ids Long[m] | None, exclude_per_row Long[N] | None, allowed Bool[N, V] | None).

    Raises:
        TypeError: a mask of the wrong type or dtype.
        ValueError: a mask of another shape or device, or an id out of range.
    """
    ids = check_token_ids(exclude_ids, like, vocab_size, like_name)
    rows = math.prod(lead)
    if exclude_per_row is not None:
        check_tensor("exclude_per_row", exclude_per_row, (torch.int64,))
        if tuple(exclude_per_row.shape) != tuple(lead):
            raise ValueError(f"exclude_per_row must have the leading shape {tuple(lead)} (one id per row), got "
                             f"{tuple(exclude_per_row.shape)}")
        check_same_device("exclude_per_row", exclude_per_row, like, like_name)
        exclude_per_row = exclude_per_row.reshape(rows).contiguous()
    if allowed is not None:
        check_tensor("allowed", allowed, (torch.bool,))
        if tuple(allowed.shape) != tuple(lead) + (vocab_size,):
            raise ValueError(f"allowed must have shape {tuple(lead) + (vocab_size,)} (one flag per token), got "
                             f"{tuple(allowed.shape)}")
        check_same_device("allowed", allowed, like, like_name)
        allowed = allowed.reshape(rows, vocab_size).contiguous()
    return ids, exclude_per_row, allowed


def check_confidence(return_logprob, confidence) -> tuple[bool, int]:
    """Validate return_logprob and confidence.

    Args:
        return_logprob: the op's `return_logprob`.
        confidence: the op's `confidence`: None, "prob", "margin" or "entropy".

    Returns:
        (return_logprob, the confidence's code: 0 for None, else 1, 2, 3 in CONFIDENCES order).

    Raises:
        TypeError: return_logprob is not a bool.
        ValueError: an unknown confidence.
    """
    if not isinstance(return_logprob, bool):
        raise TypeError(f"return_logprob must be a bool, got {type(return_logprob).__name__}")
    if confidence is None:
        return return_logprob, 0
    if confidence not in CONFIDENCES:
        raise ValueError(f"confidence must be None or one of {CONFIDENCES}, got {confidence!r}")
    return return_logprob, CONFIDENCES.index(confidence) + 1


def check_id_values(name: str, ids: Optional[torch.Tensor], vocab_size: int) -> None:
    """The range check the C++ kernels make, for the references (CPU tensors only).

    Args:
        name: the argument's name, for the message.
        ids: Long token ids, or None.
        vocab_size: V.

    Raises:
        ValueError: a CPU id outside [0, V).
    """
    if ids is None or not ids.is_cpu or ids.numel() == 0:
        return
    bad = (ids < 0) | (ids >= vocab_size)
    if bool(bad.any()):
        at = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name} values must be in [0, {vocab_size}), got {int(ids[at])} at {at}")


@dataclasses.dataclass
class Call:
    """A validated call of sample_categorical or sample_from_hidden: its rows flattened
    to [N, ...], and how to give the outputs back in the leading shape."""
    lead: tuple
    controls: Controls
    exclude_ids: Optional[torch.Tensor]
    exclude_per_row: Optional[torch.Tensor]
    allowed: Optional[torch.Tensor]
    noise: Optional[torch.Tensor]
    counters: tuple
    row_ids: Optional[torch.Tensor]
    logprob: bool
    confidence: int

    def args(self) -> tuple:
        """Everything after the logits in the schema of ddpd::sample_categorical.

        Returns:
            A tuple of the schema's arguments, in order.
        """
        seed, offset, seed_t, offset_t = self.counters
        c = self.controls
        return (c.temperature, c.temperature_t, self.exclude_ids, self.exclude_per_row, self.allowed, c.top_k,
                c.top_k_t, c.top_p, c.top_p_t, c.log_min_p, c.log_min_p_t, self.noise, seed, offset, self.row_ids,
                seed_t, offset_t, self.logprob, self.confidence)

    def tensors(self) -> tuple:
        """The call's optional tensors, for the checks that look at every tensor of a call
        (_dispatch.eager).

        Returns:
            A tuple of tensors or None.
        """
        c = self.controls
        return (self.exclude_ids, self.exclude_per_row, self.allowed, self.noise, self.row_ids, self.counters[2],
                self.counters[3], c.temperature_t, c.top_k_t, c.top_p_t, c.log_min_p_t)

    def finish(self, tokens, valid, logprob, confidence) -> Draw:
        """The Draw in the leading shape, None in the outputs not asked for.

        Args:
            tokens: Long[N] the tokens.
            valid: Bool[N] which rows could draw.
            logprob: Float32[N] or an unused output.
            confidence: Float32[N] or an unused output.

        Returns:
            Draw(tokens, valid, logprob, confidence), each of the leading shape.
        """
        logprob = logprob if self.logprob else None
        confidence = confidence if self.confidence else None
        if len(self.lead) == 1:  # rows as given: nothing to reshape
            return Draw(tokens, valid, logprob, confidence)
        return Draw(*(None if t is None else t.reshape(self.lead) for t in (tokens, valid, logprob, confidence)))

    def rows(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs [..., X] as [N, X], without gradient (a draw has none).

        Args:
            inputs: the op's logits or hidden states.

        Returns:
            The [N, X] view or copy.
        """
        x = inputs.detach() if inputs.requires_grad else inputs
        return x if x.dim() == 2 else x.reshape(math.prod(self.lead), x.shape[-1])  # not -1: H may be 0


def flat_controls(controls: Optional[DrawControls], temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p,
                  min_p) -> tuple:
    """The controls of a call that gives them as `controls` or as flat keywords (not both).

    Args:
        controls: a DrawControls, or None.
        temperature: the flat `temperature`.
        exclude_ids: the flat `exclude_ids`.
        exclude_per_row: the flat `exclude_per_row`.
        allowed: the flat `allowed`.
        top_k: the flat `top_k`.
        top_p: the flat `top_p`.
        min_p: the flat `min_p`.

    Returns:
        (temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p).

    Raises:
        TypeError: controls is not a DrawControls, or is given beside a flat control.
    """
    if controls is None:
        return temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p
    if not isinstance(controls, DrawControls):
        raise TypeError(f"controls must be a DrawControls or None, got {type(controls).__name__}")
    flat = {"temperature": None if type(temperature) is float and temperature == 1.0 else temperature,
            "top_k": top_k, "top_p": top_p, "min_p": min_p, "exclude_ids": exclude_ids,
            "exclude_per_row": exclude_per_row, "allowed": allowed}  # None: left at its default
    given = sorted(name for name, value in flat.items() if value is not None)
    if given:
        raise TypeError(f"pass the draw controls either as controls=DrawControls(...) or as keywords, not both; "
                        f"got controls and {', '.join(given)}")
    c = controls
    return c.temperature, c.exclude_ids, c.exclude_per_row, c.allowed, c.top_k, c.top_p, c.min_p


def prepare(op: str, input_name: str, inputs: torch.Tensor, vocab_size: int, temperature, exclude_ids,
            exclude_per_row, allowed, top_k, top_p, min_p, return_logprob, confidence, seed, offset, generator,
            row_ids, noise, controls=None, inputs_name: str = "logits") -> Call:
    """Validate the arguments shared by sample_categorical and sample_from_hidden;
    inputs [..., X] gives the leading shape (its rows).

    Args:
        op: the op's name, for the messages.
        input_name: what V is read from, for the messages.
        inputs: the op's logits or hidden states.
        vocab_size: V.
        temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p, return_logprob, confidence, seed,
            offset, generator, row_ids, noise, controls: the op's arguments of these names.
        inputs_name: the inputs' argument name (logits or hidden), for the device messages.

    Returns:
        The validated Call.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a shape, device or value out of range, or a transform wrapping an input.
    """
    temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p = flat_controls(
        controls, temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p)
    _dispatch.refuse_transforms(op, inputs, noise, row_ids, allowed, exclude_per_row, temperature, top_k, top_p,
                                min_p)
    _dispatch.check_width(f"V ({input_name})", vocab_size)
    lead = tuple(inputs.shape[:-1])
    rows = math.prod(lead)
    temperature, top_p, min_p = (x.detach() if isinstance(x, torch.Tensor) else x for x in (temperature, top_p, min_p))
    controls = check_controls(temperature, top_k, top_p, min_p, lead, inputs, inputs_name)
    ids, per_row, allowed = check_masks(exclude_ids, exclude_per_row, allowed, lead, inputs, vocab_size, inputs_name)
    logprob, confidence = check_confidence(return_logprob, confidence)
    width = noise_width(vocab_size)
    if noise is not None:
        check_tensor("noise", noise, (torch.float32,))
        if tuple(noise.shape) != lead + (width,):
            raise ValueError(f"noise must have shape {lead + (width,)} (noise_width(V) uniforms per row), got "
                             f"{tuple(noise.shape)}")
        noise = noise.reshape(rows, width)
    row_ids = rng.flat_row_ids(row_ids, lead)
    counters = rng.resolve_stream(noise, (rows, width), inputs, seed, offset, generator, row_ids, inputs_name)
    noise, row_ids = _dispatch.contiguous(noise, row_ids)
    return Call(lead, controls, ids, per_row, allowed, noise, counters, row_ids, logprob, confidence)


# ------------------------------------------------------------------------- reference


def drawable(x: torch.Tensor, exclude_ids: Optional[torch.Tensor], exclude_per_row: Optional[torch.Tensor],
             allowed: Optional[torch.Tensor]) -> torch.Tensor:
    """Which tokens of logits [N, V] may be drawn: not NaN, not excluded, allowed. By column
    comparison, so that an id outside [0, V) excludes nothing, as in the kernels that read
    unchecked ids (CUDA tensors); an index would wrap -1 to the last token, or fail.

    Args:
        x: Float[N, V] logits.
        exclude_ids: Long[m] excluded tokens, or None.
        exclude_per_row: Long[N] a token excluded per row, or None.
        allowed: Bool[N, V] the drawable tokens, or None.

    Returns:
        Bool[N, V].
    """
    ok = ~torch.isnan(x)
    columns = torch.arange(x.shape[1], device=x.device)
    if exclude_ids is not None:
        ok &= ~torch.isin(columns, exclude_ids)
    if exclude_per_row is not None:
        ok &= columns != exclude_per_row[:, None]
    if allowed is not None:
        ok &= allowed
    return ok


def float64_rows(x: torch.Tensor, exclude_ids: Optional[torch.Tensor], exclude_per_row: Optional[torch.Tensor],
                 allowed: Optional[torch.Tensor]) -> torch.Tensor:
    """float64 logits [N, V] as float32 relative to their row maximum M over the drawable
    tokens, subtracted in float64: a cast first turns logits beyond float32's range (1e39)
    into +-inf. The law, log-probability and confidences depend on l - M only. A row whose
    M is +inf gets 0 at its +inf entries and -inf elsewhere (its law: uniform over them);
    one with nothing drawable is only cast. Out-of-range ids exclude nothing here (the
    kernels check or ignore them).

    Args:
        x: Float64[N, V] logits.
        exclude_ids: Long[m] excluded tokens, or None.
        exclude_per_row: Long[N] a token excluded per row, or None.
        allowed: Bool[N, V] the drawable tokens, or None.

    Returns:
        Float32[N, V].
    """
    top = x.masked_fill(~drawable(x, exclude_ids, exclude_per_row, allowed), float("-inf")).amax(1, keepdim=True)
    y = x - torch.where(top.isfinite(), top, 0.0)
    infinite = torch.where(x == float("inf"), 0.0, float("-inf"))
    return torch.where(top == float("inf"), infinite, y).float()


def masked_logits(logits: torch.Tensor, exclude_ids: Optional[torch.Tensor], exclude_per_row: Optional[torch.Tensor],
                  allowed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float32 logits [N, V] with NaN, excluded and not allowed tokens set to -inf (no
    temperature yet; ids outside [0, V) exclude nothing: drawable); float64 logits relative
    to their maximum first (float64_rows).

    Args:
        logits: float [N, V].
        exclude_ids: Long[m] excluded tokens, or None.
        exclude_per_row: Long[N] a token excluded per row, or None.
        allowed: Bool[N, V] the drawable tokens, or None.

    Returns:
        Float32[N, V].
    """
    x = float64_rows(logits, exclude_ids, exclude_per_row, allowed) if logits.dtype == torch.float64 else logits.float()
    return x.masked_fill(~drawable(x, exclude_ids, exclude_per_row, allowed), float("-inf"))


def shifted(a: torch.Tensor, b: torch.Tensor, temperature) -> torch.Tensor:
    """(a - b) / temperature for a <= b (b a maximum over a's entries), in float32:
    exactly 0 where a == b (so +inf == +inf gives 0, not NaN) and -inf where a is
    -inf. Subtracting first keeps small temperatures from overflowing the quotient;
    a - b itself overflows to -inf only for a spread beyond float32's range, whose
    weight exp((a - b) / T) is 0 in float32 anyway for T <= MAX_TEMPERATURE. A
    temperature below the float32 range (0 after rounding) leaves only the maxima
    finite.

    Args:
        a: Float32 values.
        b: Float32 maxima, broadcasting against a.
        temperature: a number or a float32 tensor broadcasting against a.

    Returns:
        Float32, of the broadcast shape.
    """
    t = temperature if isinstance(temperature, torch.Tensor) else \
        torch.tensor(temperature, dtype=torch.float32, device=a.device)  # a tensor divisor: CUDA would
    # otherwise multiply by a scalar's reciprocal, which rounds differently from the kernels' division
    d = torch.where(a == b, torch.zeros((), device=a.device), (a - b) / t)
    return d.masked_fill(a == float("-inf"), float("-inf"))


def truncation_threshold(x: torch.Tensor, t: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                         log_min_p: torch.Tensor) -> torch.Tensor:
    """tau [N] of the truncation of docs/ops/sample_categorical.md (-inf where nothing is
    cut); by sorting, for clarity (the kernels search without sorting).

    Args:
        x: Float32[N, V] masked logits.
        t: Float32[N] the effective temperatures (1 for greedy rows).
        top_k: Long[N] (0: off).
        top_p: Float32[N] (1: off).
        log_min_p: Float32[N] (-inf: off).

    Returns:
        Float32[N] the thresholds.
    """
    rows, vocab = x.shape
    allowed = x > float("-inf")
    n_allowed = allowed.sum(1)
    row_max = x.amax(1, keepdim=True)
    values = x.sort(dim=1, descending=True).values
    neg_inf = torch.full((rows,), float("-inf"), device=x.device)
    k_on = (top_k > 0) & (top_k < n_allowed)
    kth = values.gather(1, (top_k - 1).clamp(0, vocab - 1)[:, None]).squeeze(1)
    tau_k = torch.where(k_on, kth, neg_inf)
    # top_p over what top_k keeps: a value is kept when the mass strictly above it is < p Z
    kept = values >= tau_k[:, None]
    e = torch.where(kept, torch.exp(shifted(values, row_max, t[:, None])), 0.0).double()
    cumulative = e.cumsum(1)
    position = torch.arange(vocab, device=x.device).expand(rows, vocab)
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[:, 1:] = values[:, 1:] != values[:, :-1]  # first position of each run of equal values
    group_start = torch.where(starts, position, 0).cummax(1).values
    strictly_above = (cumulative - e).gather(1, group_start)
    z = cumulative[:, -1]
    count = (strictly_above < (top_p.double() * z)[:, None]).sum(1)
    p_on = (top_p < 1) & (n_allowed > 0)
    tau_p = torch.where(p_on, values.gather(1, (count - 1).clamp(0, vocab - 1)[:, None]).squeeze(1), neg_inf)
    # min_p: y >= log(min_p), relative to the maximum
    y = shifted(x, row_max, t[:, None])
    smallest = torch.where(allowed & (y >= log_min_p[:, None]), x, float("inf")).amin(1)
    tau_min = torch.where((log_min_p > float("-inf")) & (n_allowed > 0), smallest, neg_inf)
    return torch.maximum(torch.maximum(tau_k, tau_p), tau_min)


def draw(x: torch.Tensor, controls: Controls, noise: torch.Tensor, logprob: bool = False,
         confidence: int = 0) -> tuple:
    """The law of docs/ops/sample_categorical.md on masked float32 logits.

    Args:
        x: Float32[N, V] masked logits.
        controls: the call's Controls.
        noise: Float32[N, noise_width(V)] (or [N, V] when V <= TILE: a single tile needs no
            tile uniform; unused by greedy rows).
        logprob: also compute the drawn token's log-probability.
        confidence: the confidence's code (0: none; 1, 2, 3 in CONFIDENCES order).

    Returns:
        (tokens Long[N], valid Bool[N], logprob Float32[N] | None, confidence Float32[N] | None).
    """
    rows, vocab = x.shape
    given, top_k, top_p, log_min_p = controls.per_row(rows, x.device)
    greedy = given < 0
    t = torch.where(greedy, 1.0, given)
    if controls.truncates:
        tau = truncation_threshold(x, t, top_k, top_p, log_min_p)
        x = x.masked_fill(x < tau[:, None], float("-inf"))
    tiles = n_tiles(vocab)
    width = TILE if tiles > 1 else vocab  # a single tile is the row itself: no padding to compute
    padded = x.new_full((rows, tiles * width), float("-inf"))
    padded[:, :vocab] = x
    padded = padded.view(rows, tiles, width)
    tile_max = padded.amax(dim=2)  # m_t
    y = shifted(padded, tile_max[:, :, None], t[:, None, None])  # tempered, relative to the tile maximum
    row_max = tile_max.amax(dim=1, keepdim=True)  # M
    if tiles == 1:
        tile = torch.zeros(rows, dtype=torch.int64, device=x.device)
    else:
        lse = torch.log(torch.exp(y).sum(dim=2))  # s_t, in [0, log TILE] or -inf
        d = shifted(tile_max, row_max, t[:, None])
        keys = torch.where(greedy[:, None], d, d + (lse + rng.gumbel(noise[:, vocab:vocab + tiles])))
        tile = keys.argmax(dim=1)  # first maximum on ties
    valid = row_max.squeeze(1) > float("-inf")
    in_tile = y.gather(1, tile[:, None, None].expand(-1, 1, width)).squeeze(1)
    columns = tile[:, None] * width + torch.arange(width, device=x.device)
    u = noise.gather(1, columns.clamp(max=vocab - 1))
    in_tile = torch.where(greedy[:, None], in_tile, in_tile + rng.gumbel(u))
    keys = torch.where(columns < vocab, in_tile, float("-inf"))
    token = torch.where(valid, columns.gather(1, keys.argmax(dim=1, keepdim=True)).squeeze(1), 0)
    if not logprob and not confidence:
        return token, valid, None, None
    return (token, valid) + statistics(x, t, row_max, token, valid, logprob, confidence)


def statistics(x, t, row_max, token, valid, logprob: bool, confidence: int) -> tuple:
    """The log-probability and confidence of the drawn tokens under the truncated,
    tempered law, in float64 then float32 (docs/ops/sample_categorical.md, step 3).

    Args:
        x: Float32[N, V] masked, truncated logits.
        t: Float32[N] the effective temperatures.
        row_max: Float32[N, 1] each row's maximum of x.
        token: Long[N] the drawn tokens.
        valid: Bool[N] which rows could draw.
        logprob: compute the log-probability.
        confidence: the confidence's code (0: none; 1, 2, 3 in CONFIDENCES order).

    Returns:
        (logprob Float32[N] | None, confidence Float32[N] | None); -inf in invalid rows.
    """
    y = shifted(x, row_max, t[:, None]).double()  # relative to M, -inf outside K
    log_z = torch.logsumexp(y, dim=1)
    lp = y.gather(1, token[:, None]).squeeze(1) - log_z
    neg_inf = torch.full_like(lp, float("-inf"))
    out_lp = torch.where(valid, lp, neg_inf).float() if logprob else None
    if not confidence:
        return out_lp, None
    if confidence == 1:
        c = lp.exp()
    elif confidence == 2:
        top = torch.cat([x, x.new_full((x.shape[0], 1), float("-inf"))], 1).topk(2, dim=1).values
        second = shifted(top[:, 1:], row_max, t[:, None]).double().squeeze(1)
        c = (1.0 - second.exp()) * torch.exp(-log_z)
    else:
        p = torch.exp(y - log_z[:, None])
        c = torch.where(p > 0, p * (y - log_z[:, None]), 0.0).sum(1)
    return out_lp, torch.where(valid, c, neg_inf).float()


def categorical_reference(logits: torch.Tensor, temperature, noise: Optional[torch.Tensor], *, top_k=None, top_p=None,
                          min_p=None, return_logprob: bool = False, confidence: Optional[str] = None) -> Draw:
    """The categorical draw of every ddpd path, in plain torch (ddpd.ops.reference.categorical).

    One token per row of the law of docs/ops/sample_categorical.md (steps 1-3) by the
    two-level Gumbel-max; every path (C++, Triton, the samplers' reference) is tested against it.

    Args:
        logits: [N, V] any float dtype; NaN reads as -inf; excluded tokens already -inf.
        temperature: in [0, MAX_TEMPERATURE] (0: greedy), a number or a per-row tensor [N].
        noise: [N, noise_width(V)] uniforms (column j for token j, column V + t for tile t),
            or [N, V] when V <= TILE (a single tile needs no tile uniform); None when every
            row is greedy.
        top_k, top_p, min_p: numbers or per-row tensors [N] (None: off).
        return_logprob: also return the drawn token's log-probability.
        confidence: None, or "prob", "margin" or "entropy".

    Returns:
        Draw(tokens Long[N], valid Bool[N], logprob or None, confidence or None): token 0 and
        valid False where every logit is -inf or NaN.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a shape or value out of range, or no noise for a row that is not greedy.
    """
    check_tensor("logits", logits, FLOATS, 2)
    controls = check_controls(temperature, top_k, top_p, min_p, tuple(logits.shape[:1]), logits)
    logprob, code = check_confidence(return_logprob, confidence)
    if noise is not None:
        rows, vocab = logits.shape
        shapes = {(rows, noise_width(vocab))} | ({(rows, vocab)} if vocab <= TILE else set())
        if tuple(noise.shape) not in shapes:
            raise ValueError(f"noise must have shape {' or '.join(map(str, sorted(shapes)))}, got "
                             f"{tuple(noise.shape)}")
        rng.check_noise_values(noise)
    if noise is None:  # a greedy draw reads no uniform
        if not bool((controls.per_row(logits.shape[0], logits.device)[0] < 0).all()):
            raise ValueError("noise is needed unless every row is drawn greedily (temperature 0)")
        noise = logits.new_full((logits.shape[0], noise_width(logits.shape[1])), 0.5, dtype=torch.float32)
    return Draw(*draw(masked_logits(logits, None, None), controls, noise, logprob, code))


def sample_categorical_reference(
    logits: torch.Tensor,
    temperature=1.0,
    exclude_ids=None,
    exclude_per_row: Optional[torch.Tensor] = None,
    *,
    top_k=None,
    top_p=None,
    min_p=None,
    allowed: Optional[torch.Tensor] = None,
    controls: Optional[DrawControls] = None,
    return_logprob: bool = False,
    confidence: Optional[str] = None,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> Draw:
    """Plain torch version of sample_categorical, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.sample_categorical.

    Returns:
        What ddpd.ops.sample_categorical returns (Draw).

    Raises:
        What ddpd.ops.sample_categorical raises.
    """
    call = prepare_categorical(logits, temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p,
                               min_p, return_logprob, confidence, seed, offset, generator, row_ids, noise, controls)
    vocab = logits.shape[-1]
    x = logits.reshape(-1, vocab)
    check_id_values("exclude_ids", call.exclude_ids, vocab)
    check_id_values("exclude_per_row", call.exclude_per_row, vocab)
    rng.check_noise_values(call.noise)
    noise = call.noise
    if noise is None:
        noise = rng.stream_noise(call.counters, call.row_ids, x.shape[0], noise_width(vocab), x.device)
    masked = masked_logits(x, call.exclude_ids, call.exclude_per_row, call.allowed)
    return call.finish(*draw(masked, call.controls, noise, call.logprob, call.confidence))


# ------------------------------------------------------------------------ fused op


# The tile statistics' launch: programs of one warp, each reading 2 tiles at a time, 64 of them
# per multiprocessor (more than fit at once: the grid runs in waves); one warp reduces a tile
# without shared memory or barriers. Measured against other launches in docs/performance.md.
STATS_PROGRAMS_PER_SM, STATS_TILES_PER_LOAD, STATS_WARPS = 64, 2, 1
# The finish pass: one program a row, of 4 warps (Triton's default); latency-bound at few rows:
# fewer warps make each warp's loop over the tiles longer with fewer barriers, more the reverse
# (docs/performance.md; the launch sweep of benchmarks/gpu_timings.py times 2, 4, 8).
FINISH_WARPS = 4


@dataclasses.dataclass(frozen=True)
class CategoricalLaunch:
    """Grids of the Triton kernels for one call (ddpd.kernels.sample_categorical).

    stats_grid (rows, splits): tile statistics, each program (stats_warps warps) a run of
    tiles_per_split tiles, tiles_per_chunk at a time; None for a single tile. finish_grid (rows,):
    the tile race and the token draw, a few hundred values per row. (A truncating call
    first runs the threshold search, one program per row.)"""
    splits: int
    tiles_per_split: int
    tiles_per_chunk: int
    stats_grid: Optional[tuple]
    finish_grid: tuple
    stats_warps: int = STATS_WARPS
    finish_warps: int = FINISH_WARPS


@functools.lru_cache(maxsize=256)  # a per-call cost otherwise; a sampler calls it with few shapes
def categorical_launch(rows: int, vocab: int, multiprocessors: int, programs_per_sm: int = STATS_PROGRAMS_PER_SM,
                       tiles_per_load: int = STATS_TILES_PER_LOAD, warps: int = STATS_WARPS,
                       finish_warps: int = FINISH_WARPS) -> CategoricalLaunch:
    """Split each row's tiles over enough programs for programs_per_sm per multiprocessor
    (a single row of GPT-2's vocabulary: one tile per program), whole rows when the rows
    alone fill the device.

    Args:
        rows: N.
        vocab: V.
        multiprocessors: the device's multiprocessors.
        programs_per_sm: tile-statistics programs to aim at per multiprocessor.
        tiles_per_load: the most tiles a program reads at a time.
        warps: the warps of a tile-statistics program.
        finish_warps: the warps of a finish program.

    Returns:
        The CategoricalLaunch.
    """
    tiles = n_tiles(vocab)
    if tiles == 1:
        return CategoricalLaunch(1, 1, 1, None, (rows,), finish_warps=finish_warps)
    splits = max(1, min(tiles, -(-programs_per_sm * multiprocessors // max(rows, 1))))
    per_split = -(-tiles // splits)
    splits = -(-tiles // per_split)
    chunk = min(tiles_per_load, 1 << (per_split - 1).bit_length())
    return CategoricalLaunch(splits, per_split, chunk, (rows, splits), (rows,), warps, finish_warps)


def empty_outputs(rows: int, device: torch.device, logprob: bool, confidence: int, eager: bool = False) -> tuple:
    """(tokens, valid, logprob, confidence) for the kernels to write. An output not asked for
    is empty; in an eager call (Call.finish drops it, and no kernel writes it) it is one
    empty tensor that such calls share, as an allocation costs a call host time. The
    registered op returns outputs of its own: they may not alias.

    Args:
        rows: N.
        device: the device of the outputs.
        logprob: whether the log-probability is asked for.
        confidence: the confidence's code (0: none).
        eager: a call that does not go through the registered op.

    Returns:
        (Long[N], Bool[N], Float32[N] or empty, Float32[N] or empty).
    """
    def extra(asked: bool) -> torch.Tensor:
        if not asked and eager:
            return _dispatch.unused_output(device)
        return torch.empty(rows if asked else 0, dtype=torch.float32, device=device)

    return (torch.empty(rows, dtype=torch.int64, device=device), torch.empty(rows, dtype=torch.bool, device=device),
            extra(logprob), extra(bool(confidence)))


def threshold_launch(vocab: int) -> tuple[int, int, int]:
    """The threshold kernel's top-k bound for rows of vocab logits: groups of GROUP logits (a
    power of two from GROUP_MIN, up to a scan block), at most MAX_GROUPS of them, and room for
    capacity candidates a row. n_groups = 0 (no bound, every search pass reads the row)
    beyond MAX_GROUPS scan blocks.

    Args:
        vocab: V.

    Returns:
        (GROUP, n_groups, capacity).
    """
    group = max(GROUP_MIN, 1 << (-(-vocab // MAX_GROUPS) - 1).bit_length())
    if group > THRESHOLD_SCAN_BLOCK:
        return THRESHOLD_SCAN_BLOCK, 0, 0
    return group, -(-vocab // group), min(CANDIDATES, vocab)


def truncation_flags(top_k, top_k_t, top_p, top_p_t, log_min_p, log_min_p_t) -> tuple[bool, bool, bool]:
    """Which thresholds a call computes (per-row tensors: all their rows).

    Args:
        top_k: the scalar top_k (0: off).
        top_k_t: the per-row top_k, or None.
        top_p: the scalar top_p (1: off).
        top_p_t: the per-row top_p, or None.
        log_min_p: the scalar log min_p (-inf: off).
        log_min_p_t: the per-row log min_p, or None.

    Returns:
        (top_k, top_p, min_p) flags.
    """
    return (top_k_t is not None or top_k > 0, top_p_t is not None or top_p < 1.0,
            log_min_p_t is not None or log_min_p > -math.inf)


def sample_categorical_triton(logits, temperature, temperature_t, exclude_ids, exclude_per_row, allowed, top_k,
                              top_k_t, top_p, top_p_t, log_min_p, log_min_p_t, noise, seed, offset, row_ids, seed_t,
                              offset_t, logprob, confidence, eager=False):
    """Launch the Triton kernels (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    Args:
        logits: float [N, V], validated.
        temperature: the scalar temperature (GREEDY for greedy), read when temperature_t is None.
        temperature_t: Float32[N] per-row temperatures, or None.
        exclude_ids: Long[m] excluded tokens, or None.
        exclude_per_row: Long[N] a token excluded per row, or None.
        allowed: Bool[N, V] the drawable tokens, or None.
        top_k: the scalar top_k (0: off).
        top_k_t: Long[N] per-row top_k, or None.
        top_p: the scalar top_p (1: off).
        top_p_t: Float32[N] per-row top_p, or None.
        log_min_p: the scalar log min_p (-inf: off).
        log_min_p_t: Float32[N] per-row log min_p, or None.
        noise: Float32[N, noise_width(V)] explicit uniforms, or None to draw from the stream.
        seed: the stream's seed, an int64 bit pattern (read when seed_t is None).
        offset: the stream's offset, likewise.
        row_ids: Long[N] stream ids of the rows, or None for 0..N-1.
        seed_t: an int64 tensor holding the seed, or None.
        offset_t: an int64 tensor holding the offset, or None.
        logprob: whether the log-probability is asked for.
        confidence: the confidence's code (0: none).
        eager: a call that does not go through the registered op (see empty_outputs).

    Returns:
        (tokens, valid, logprob, confidence) as empty_outputs makes them, written.
    """
    kernels = _dispatch.kernels("sample_categorical")
    logits = logits.contiguous()
    rows, vocab = logits.shape
    device = logits.device
    outputs = empty_outputs(rows, device, logprob, confidence, eager)
    if rows == 0:
        return outputs
    launch = categorical_launch(rows, vocab, _dispatch.multiprocessors(device))
    tiles = n_tiles(vocab)
    ids = exclude_ids if exclude_ids is not None else _dispatch.device_ids((), device)
    masks = (ids, 0 if exclude_ids is None else exclude_ids.numel(), exclude_per_row, allowed)
    temp = (temperature, temperature_t)
    flags = truncation_flags(top_k, top_k_t, top_p, top_p_t, log_min_p, log_min_p_t)
    tau = None
    if any(flags):
        tau = torch.empty(rows, dtype=torch.float32, device=device)
        group, n_groups, capacity = threshold_launch(vocab) if flags[0] else (THRESHOLD_SCAN_BLOCK, 0, 0)
        if flags[1]:  # top-p copies its candidates out too, and wants more room
            capacity = max(capacity, min(TOP_P_CANDIDATES, vocab))
        scratch = torch.empty(rows, n_groups + capacity, dtype=torch.float32, device=device) \
            if n_groups + capacity else tau
        _dispatch.launch(kernels.thresholds_kernel, (rows,), logits, vocab, *temp, *masks, top_k, top_k_t, top_p,
                         top_p_t, log_min_p, log_min_p_t, tau, scratch, n_groups, capacity,
                         TOP_K=flags[0], TOP_P=flags[1], MIN_P=flags[2], BLOCK=THRESHOLD_BLOCK,
                         SCAN_BLOCK=THRESHOLD_SCAN_BLOCK, GROUP=group, num_warps=THRESHOLD_WARPS)
    stats = None
    if launch.stats_grid:
        stats = torch.empty(rows, tiles, kernels.RECORD.value, dtype=torch.float32, device=device)
        align = 16 // logits.element_size()  # logits a window's alignment
        _dispatch.launch(
            kernels.tile_stats_kernel, launch.stats_grid,
            logits, vocab, tiles, launch.tiles_per_split, *temp, *masks, tau, stats,
            TILE=TILE, TILES_PER_CHUNK=launch.tiles_per_chunk, ALIGN=align, SECOND=confidence == 2,
            ENTROPY=confidence == 3, UNIT=temperature_t is None and temperature == 1.0,
            num_warps=launch.stats_warps,
        )
    _dispatch.launch(
        kernels.finish_kernel, launch.finish_grid,
        logits, vocab, tiles, *temp, *masks, tau, noise, row_ids, *rng.split32(seed), *rng.split32(offset), seed_t,
        offset_t, stats, *outputs,
        TILE=TILE, BLOCK_J=TILE if tiles > 1 else 1 << (vocab - 1).bit_length(),
        BLOCK_T=min(1024, 1 << (tiles - 1).bit_length()), SINGLE_TILE=tiles == 1, LOGPROB=logprob,
        CONFIDENCE=confidence, num_warps=launch.finish_warps,
    )
    return outputs


def _sample_categorical_impl(logits, *args, eager=False):
    """The kernels behind the op (arguments validated; the op's schema): Triton on CUDA,
    C++ on CPU, which also range-checks the ids and the explicit noise. eager: a call that
    does not go through the op (see empty_outputs)."""
    if logits.is_cuda:
        return sample_categorical_triton(logits, *args, eager=eager)
    return _dispatch.cpu_kernel("sample_categorical_cpu")(logits.contiguous(), *args)


@torch.library.custom_op("ddpd::sample_categorical", mutates_args=())
def _sample_categorical_op(
    logits: torch.Tensor,
    temperature: float,
    temperature_t: Optional[torch.Tensor],
    exclude_ids: Optional[torch.Tensor],
    exclude_per_row: Optional[torch.Tensor],
    allowed: Optional[torch.Tensor],
    top_k: int,
    top_k_t: Optional[torch.Tensor],
    top_p: float,
    top_p_t: Optional[torch.Tensor],
    log_min_p: float,
    log_min_p_t: Optional[torch.Tensor],
    noise: Optional[torch.Tensor],
    seed: int,
    offset: int,
    row_ids: Optional[torch.Tensor],
    seed_t: Optional[torch.Tensor],
    offset_t: Optional[torch.Tensor],
    logprob: bool,
    confidence: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _sample_categorical_impl(logits, temperature, temperature_t, exclude_ids, exclude_per_row, allowed, top_k,
                                    top_k_t, top_p, top_p_t, log_min_p, log_min_p_t, noise, seed, offset, row_ids,
                                    seed_t, offset_t, logprob, confidence)


@_sample_categorical_op.register_fake
def _(logits, *args):
    logprob, confidence = args[-2:]
    return empty_outputs(logits.shape[0], logits.device, logprob, confidence)


def prepare_categorical(logits, temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p,
                        return_logprob, confidence, seed, offset, generator, row_ids, noise, controls=None) -> Call:
    """Validate the arguments of sample_categorical (prepare, after the logits' own checks).

    Args:
        logits, temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p, return_logprob, confidence,
            seed, offset, generator, row_ids, noise, controls: the op's arguments of these names.

    Returns:
        The validated Call.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: 0-d logits, or a shape, device or value out of range.
    """
    check_tensor("logits", logits, LOGIT_DTYPES)
    if logits.dim() == 0:
        raise ValueError("logits must have shape [..., V], got a 0-d tensor")
    return prepare("sample_categorical", "logits.shape[-1]", logits, logits.shape[-1], temperature,
                   exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p, return_logprob, confidence, seed, offset,
                   generator, row_ids, noise, controls)


def sample_categorical(
    logits: torch.Tensor,
    temperature=1.0,
    exclude_ids=None,
    exclude_per_row: Optional[torch.Tensor] = None,
    *,
    top_k=None,
    top_p=None,
    min_p=None,
    allowed: Optional[torch.Tensor] = None,
    controls: Optional[DrawControls] = None,
    return_logprob: bool = False,
    confidence: Optional[str] = None,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> Draw:
    """Draw one token per row of `logits` [..., V] (docs/ops/sample_categorical.md).

    P(token j) = softmax(logits / temperature)_j over the tokens the controls keep, drawn by an
    exact two-level Gumbel-max without a softmax.

    Args:
        logits: float32/bfloat16/float16/float64 [..., V]; NaN is never drawn.
        controls: the draw controls as one DrawControls (temperature, top_k, top_p, min_p,
            exclude_ids, exclude_per_row, allowed); or give them as the flat keywords below,
            not both.
        temperature: a number in [0, 1e36] or a tensor of the leading shape; 0 draws the argmax.
        exclude_ids: tokens no row may draw (ints or an integer tensor).
        exclude_per_row: Long[...] one more excluded token per row.
        top_k, top_p, min_p: truncations, numbers or tensors of the leading shape (None: off).
        allowed: Bool[..., V] the tokens each row may draw.
        return_logprob: also return the drawn token's log-probability under the tempered,
            truncated law.
        confidence: None, or "prob", "margin" or "entropy": also return that confidence.
        seed: int in [0, 2**64) or an int64 tensor of one element on the input's device (read by
            the kernels: advancing it in place gives fresh draws on each replay of a CUDA graph);
            None draws seed and offset from `generator`.
        offset: like seed; give calls that share a seed different offsets.
        generator: the torch.Generator seed and offset are drawn from (default: torch's global one).
        row_ids: Long ids naming each row's stream (default 0..N-1 over the flattened rows).
        noise: explicit uniforms in (0, 1] instead of a stream Float[..., noise_width(V)].

    Returns:
        Draw(tokens Long[...] in [0, V), valid Bool[...] (False where no token was drawable,
        the token there 0), logprob Float[...] or None, confidence Float[...] or None).

    Raises:
        TypeError: an argument of the wrong type, or controls beside a flat control.
        ValueError: a shape, device or value out of range (values of tensors are checked on
            CPU tensors outside tracing only).

    Example:
        >>> draw = sample_categorical(logits, controls=DrawControls(temperature=0.8, top_p=0.9), seed=0)
        >>> draw.tokens
    """
    call = prepare_categorical(logits, temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p,
                               min_p, return_logprob, confidence, seed, offset, generator, row_ids, noise, controls)
    x = call.rows(logits)
    if x.dtype == torch.float64:  # the kernels read float32
        x = float64_rows(x, call.exclude_ids, call.exclude_per_row, call.allowed)
    if _dispatch.eager(x, *call.tensors()):
        return call.finish(*_sample_categorical_impl(x, *call.args(), eager=True))
    return call.finish(*_sample_categorical_op(x, *call.args()))
