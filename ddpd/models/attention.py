"""Multi-head self-attention with rotary position embeddings, and its kernel dispatch.

softmax(Q K^T / sqrt(d_head)) V per head, bidirectional (planner and denoisers see the
whole noisy sequence x_t) or causal (autoregressive judge). Positions enter only through
rotary embeddings of Q and K, so a score depends on the relative offset.

The backend ("fa2", "fa3", "fa4", "sdpa-flash", "sdpa", "math") is chosen per call by
`resolve_backend` ("auto": a FlashAttention kernel for CUDA fp16/bf16 on sm80+, else
torch's sdpa) or forced with `set_attention_backend` / `attention_backend`;
`record_attention` counts which ran. The table of backends, the preference by GPU and
the torch.compile note are in docs/models.md ("Attention")."""
from __future__ import annotations

import collections
import contextlib
import importlib
import math
from collections import Counter
from collections.abc import Iterator
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ddpd.ops.rotary import rotate

FLASH_KERNELS = ("fa2", "fa3", "fa4")
ATTENTION_BACKENDS = ("auto", "flash") + FLASH_KERNELS + ("sdpa-flash", "sdpa", "math")
_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD_DIM = 256
_NO_DROPOUT = ("fa3", "fa4")  # their interfaces take no dropout_p
# (module, attribute) tried in order for each flash-attn generation
_FLASH_MODULES = {
    "fa2": (("flash_attn", "flash_attn_func"),),
    "fa3": (("flash_attn_interface", "flash_attn_func"), ("flash_attn_3.flash_attn_interface", "flash_attn_func")),
    "fa4": (("flash_attn.cute", "flash_attn_func"),),
}
_forced_backend = "auto"
_recorders: list = []
_flash_functions: dict = {}  # generation -> its flash_attn_func, or None when not installed
_capabilities: dict = {}  # CUDA device index -> compute capability


# ---------------------------------------------------------------------------- discovery

def load_flash_kernel(name: str) -> Optional[Callable]:
    """The flash_attn_func of flash-attn generation `name` ("fa2", "fa3", "fa4"), or
    None when it is not installed (or its import fails). Cached: call
    `clear_flash_cache()` after installing one in a running process.

    Args:
        name: "fa2", "fa3" or "fa4".

    Returns:
        The generation's flash_attn_func, or None.
    """
    if name not in _flash_functions:
        _flash_functions[name] = _import_flash(name)
    return _flash_functions[name]


def clear_flash_cache() -> None:
    """Forget which flash-attn generations were found (they are looked up again)."""
    _flash_functions.clear()


def _import_flash(name: str) -> Optional[Callable]:
    for module_name, attribute in _FLASH_MODULES[name]:
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, OSError):  # OSError: a build whose CUDA library does not load
            continue
    return None


def flash_available() -> bool:
    """True when any flash-attn generation (fa2, fa3, fa4) is importable.

    Returns:
        Whether fa2, fa3 or fa4 can be imported.
    """
    return any(load_flash_kernel(name) is not None for name in FLASH_KERNELS)


def flash_preference(capability: tuple[int, int]) -> tuple[str, ...]:
    """flash-attn generations in order of preference for a GPU of this compute capability.

    Args:
        capability: the GPU's (major, minor) compute capability.

    Returns:
        Generation names, the preferred first (empty before sm80).
    """
    major = capability[0]
    if major >= 10:
        return ("fa4", "fa2")  # FA3 is a Hopper-only build
    if major == 9:
        return ("fa3", "fa2", "fa4")
    return ("fa2",) if major == 8 else ()


def flash_kernel_for(capability: tuple[int, int], dropout_p: float = 0.0) -> Optional[str]:
    """The installed flash-attn generation "auto" runs on this GPU (None: none fits).

    Args:
        capability: the GPU's (major, minor) compute capability.
        dropout_p: the attention dropout (fa3 and fa4 take none).

    Returns:
        The generation name, or None.
    """
    for name in flash_preference(capability):
        if dropout_p > 0.0 and name in _NO_DROPOUT:
            continue
        if load_flash_kernel(name) is not None:
            return name
    return None


def warm_dispatch(device: torch.device) -> None:
    """Fill the caches the dispatch reads for `device` (which flash-attn generations are
    installed, the GPU's compute capability), as one eager call would: before torch.compile.

    Args:
        device: the device the model will run on.
    """
    flash_available()
    if device.type == "cuda":
        _device_capability(device.index if device.index is not None else torch.cuda.current_device())


def _device_capability(index: Optional[int]) -> tuple[int, int]:
    if index not in _capabilities:
        _capabilities[index] = torch.cuda.get_device_capability(index)
    return _capabilities[index]


def _flash_capability(q: torch.Tensor) -> Optional[tuple[int, int]]:
    """Compute capability of q's GPU when a FlashAttention kernel can take q (CUDA
    fp16/bf16, head_dim <= 256 and a multiple of 8, sm80 or later), else None."""
    head_dim = q.shape[-1]
    if not (q.is_cuda and q.dtype in _FLASH_DTYPES and head_dim <= _FLASH_MAX_HEAD_DIM and head_dim % 8 == 0):
        return None
    capability = _device_capability(q.device.index)
    return capability if capability[0] >= 8 else None


# ---------------------------------------------------------------------------- settings

def set_attention_backend(name: str) -> None:
    """Force an attention backend for every later call ("auto" restores the default rule).

    Args:
        name: one of ATTENTION_BACKENDS: "auto", "flash", "fa2", "fa3", "fa4",
            "sdpa-flash", "sdpa" or "math".

    Raises:
        ValueError: an unknown name, or a flash-attn generation that is not installed.
    """
    global _forced_backend
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"set_attention_backend: name expected one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "flash" and not flash_available():
        raise ValueError("set_attention_backend: name='flash' but no flash-attn (fa2, fa3 or fa4) is importable")
    if name in FLASH_KERNELS and load_flash_kernel(name) is None:
        module = " or ".join(m for m, _ in _FLASH_MODULES[name])
        raise ValueError(f"set_attention_backend: name={name!r} but {module} is not importable")
    _forced_backend = name


def get_attention_backend() -> str:
    """The forced setting ("auto" unless set_attention_backend changed it).

    Returns:
        The forced backend name, or "auto".
    """
    return _forced_backend


@contextlib.contextmanager
def attention_backend(name: str) -> Iterator[None]:
    """Context manager form of set_attention_backend; restores the previous setting.

    Args:
        name: as for set_attention_backend.

    Yields:
        None; the backend is forced inside the block.

    Raises:
        ValueError: as set_attention_backend.
    """
    previous = _forced_backend
    set_attention_backend(name)
    try:
        yield
    finally:
        set_attention_backend(previous)


@contextlib.contextmanager
def record_attention() -> Iterator[Counter]:
    """Count the backend of every attention call made inside the block:
    `with record_attention() as calls: model(x, t)` gives e.g. Counter({"fa2": 4}).
    Counts eager calls only (a replayed CUDA graph runs no Python).

    Yields:
        A Counter of backend name -> calls, filled as the block runs.
    """
    calls: Counter = collections.Counter()
    _recorders.append(calls)
    try:
        yield calls
    finally:  # by identity: two recorders can hold equal counts
        _recorders[:] = [r for r in _recorders if r is not calls]


def resolve_backend(q: torch.Tensor, dropout_p: float = 0.0) -> str:
    """The backend attention(q, ..., dropout_p) runs: one of FLASH_KERNELS, "sdpa-flash",
    "sdpa" or "math". Raises ValueError when a forced backend cannot take q.

    Args:
        q: the queries, [B, H, L, d].
        dropout_p: the attention dropout.

    Returns:
        The backend name.

    Raises:
        ValueError: a forced backend cannot take `q` or the dropout, or a forced flash-attn
            generation does not run on q's GPU (fa3 is Hopper-only; fa4 needs sm90+).
    """
    forced = _forced_backend
    if forced in ("sdpa", "math"):
        return forced
    capability = _flash_capability(q)
    if forced == "auto":
        if capability is None:
            return "sdpa"
        return flash_kernel_for(capability, dropout_p) or "sdpa-flash"
    if capability is None and (forced != "sdpa-flash" or q.is_cuda):
        raise ValueError(f"attention backend {forced!r} is forced but needs CUDA fp16/bf16 tensors with head_dim "
                         f"<= {_FLASH_MAX_HEAD_DIM} and a multiple of 8 on an sm80+ GPU; got device={q.device}, "
                         f"dtype={q.dtype}, head_dim={q.shape[-1]}")
    if forced == "sdpa-flash":
        if not q.is_cuda and dropout_p > 0.0:
            raise ValueError(f"attention backend 'sdpa-flash' is forced but torch's CPU flash kernel runs without "
                             f"dropout, got dropout_p={dropout_p} (a model in train mode with dropout)")
        return forced
    if forced in FLASH_KERNELS and forced not in flash_preference(capability):
        raise ValueError(f"attention backend {forced!r} is forced but is not built for compute capability "
                         f"{capability}; this GPU runs {flash_preference(capability)}")
    kernel = flash_kernel_for(capability, dropout_p) if forced == "flash" else forced
    if kernel is None or (dropout_p > 0.0 and kernel in _NO_DROPOUT):
        raise ValueError(f"attention backend {forced!r} is forced but no installed flash-attn kernel runs with "
                         f"dropout_p={dropout_p} on compute capability {capability}")
    return kernel


# ---------------------------------------------------------------------------- kernels

def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Reference: softmax(q k^T / sqrt(d)) v on [B, H, L, d] tensors, computed in float32.

    Args:
        q, k, v: [B, H, L, d] queries, keys and values.
        causal: whether position i attends only to positions <= i.

    Returns:
        [B, H, L, d] in the dtype of `v` (the models pass q, k and v of one dtype).
    """
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        length = q.shape[-2]
        future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return (scores.softmax(dim=-1) @ v.float()).to(v.dtype)


def _flash_attention(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                     dropout_p: float) -> torch.Tensor:
    """A flash-attn generation on [B, H, L, d] tensors (its interface is [B, L, H, d])."""
    function = load_flash_kernel(kernel)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if kernel == "fa2":
        out = function(q, k, v, dropout_p=dropout_p, causal=causal)
    else:
        out = function(q, k, v, causal=causal)
    if isinstance(out, tuple):  # FA4 and some FA3 releases return (out, softmax_lse)
        out = out[0]
    return out.transpose(1, 2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              dropout_p: float = 0.0) -> torch.Tensor:
    """Scaled dot-product attention on [B, H, L, d] tensors with the resolved backend.

    Args:
        q, k, v: [B, H, L, d] queries, keys and values.
        causal: whether position i attends only to positions <= i.
        dropout_p: the attention dropout (training only).

    Returns:
        [B, H, L, d] in the dtype of `q`.

    Raises:
        ValueError: a forced backend cannot take the tensors or the dropout.
    """
    backend = resolve_backend(q, dropout_p)
    for calls in _recorders:
        calls[backend] += 1
    if backend in FLASH_KERNELS:
        return _flash_attention(backend, q, k, v, causal, dropout_p)
    if backend == "sdpa-flash":
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    if backend == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    if dropout_p > 0.0:
        raise ValueError(f"attention: the 'math' backend has no dropout, got dropout_p={dropout_p}")
    return explicit_attention(q, k, v, causal)


# ---------------------------------------------------------------------------- modules

class RotaryEmbedding(nn.Module):
    """Rotates channel pairs (i, i + d/2) of q and k by angle pos * base^(-2i/d).

    The cos/sin tables stay float32 whatever dtype the network is cast to (a bf16
    table would round the angles); they follow the network's device."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        device = torch.empty(0).device  # the default device: that of `with torch.device(...)`, if any
        if device.type == "meta":  # a skeleton (build_skeleton): shapes only; the meta device's arithmetic
            # imports torch._dynamo, triton and sympy, seconds of every checkpoint load
            tables = [torch.empty(max_seq_len, (head_dim + 1) // 2) for _ in range(2)]
        else:
            tables = self._tables(max_seq_len, device)
        # not persistent: derived from the config, so never stored in checkpoints
        self.register_buffer("cos", tables[0], persistent=False)
        self.register_buffer("sin", tables[1], persistent=False)

    def _tables(self, max_seq_len: int, device: torch.device) -> list[torch.Tensor]:
        """float32 [max_seq_len, ceil(head_dim / 2)] cos and sin tables on `device`, computed on
        the CPU in float64 (the same values whatever the device)."""
        inv_freq = self.base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64, device="cpu") / self.head_dim)
        angles = torch.arange(max_seq_len, dtype=torch.float64, device="cpu")[:, None] * inv_freq[None, :]
        return [angles.cos().float().to(device), angles.sin().float().to(device)]

    def _apply(self, fn, recurse=True):
        tables = (self.cos, self.sin)
        super()._apply(fn, recurse)
        if tables[0].is_meta and not self.cos.is_meta:  # to_empty() of a skeleton: no values to copy
            tables = self._tables(tables[0].shape[0], self.cos.device)
        self.cos, self.sin = (table.to(self.cos.device) for table in tables)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, H, L, d] -> x rotated by its position along L (computed in float32).

        On CUDA without a gradient (sampling) one Triton kernel does it, with the same
        values bit for bit; elsewhere the plain torch rotation (ddpd.ops.rotary.rotate).

        Args:
            x: [B, H, L, d] queries or keys.

        Returns:
            [B, H, L, d] in the dtype of `x`.
        """
        return rotate(x, self.cos, self.sin)


def _rotary_beside_weights(attn: nn.Module, incompatible_keys) -> None:
    """After a load: a skeleton filled by load_state_dict(assign=True) has its weights, but its
    rotary tables (in no state dict) stayed on the meta device; computed where the weights are."""
    rotary, weight = attn.rotary, attn.qkv.weight
    if rotary.cos.is_meta and not weight.is_meta:
        rotary.cos, rotary.sin = rotary._tables(rotary.cos.shape[0], weight.device)


class SelfAttention(nn.Module):
    """Multi-head self-attention block: qkv projection, rotary, attention, output projection."""

    def __init__(self, d_model: int, n_heads: int, max_seq_len: int, causal: bool, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.causal = causal
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.rotary = RotaryEmbedding(d_model // n_heads, max_seq_len)
        self.resid_dropout = nn.Dropout(dropout)
        self.register_load_state_dict_post_hook(_rotary_beside_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Multi-head self-attention of x with rotary positions.

        Args:
            x: [B, L, d_model] hidden states.

        Returns:
            [B, L, d_model].
        """
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, width // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = self.rotary(q), self.rotary(k)
        out = attention(q, k, v, self.causal, dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2).reshape(batch, length, width)
        return self.resid_dropout(self.proj(out))
