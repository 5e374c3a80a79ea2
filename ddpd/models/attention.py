"""Multi-head self-attention with rotary position embeddings.

softmax(Q K^T / sqrt(d_head)) V per head, bidirectional (planner and denoisers see
the whole noisy sequence x_t) or causal (autoregressive judge). Positions enter only
through rotary embeddings of Q and K, so a score depends on the relative offset.

Backends: flash-attn's `flash_attn_func` when it is importable and the tensors are
CUDA fp16/bf16, otherwise torch's `scaled_dot_product_attention`; `explicit_attention`
is the plain reference the other two are tested against. `set_attention_backend`
forces one ("auto", "flash", "sdpa", "math"); `resolve_backend` says which one a
given tensor would use.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from flash_attn import flash_attn_func
except ImportError:  # flash-attn is an optional CUDA-only dependency
    flash_attn_func = None

ATTENTION_BACKENDS = ("auto", "flash", "sdpa", "math")
_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD_DIM = 256
_forced_backend = "auto"


def flash_available() -> bool:
    return flash_attn_func is not None


def set_attention_backend(name: str) -> None:
    """Force an attention backend for every later call ("auto" restores the default)."""
    global _forced_backend
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"set_attention_backend: name expected one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "flash" and not flash_available():
        raise ValueError("set_attention_backend: name='flash' but flash_attn is not importable")
    _forced_backend = name


def get_attention_backend() -> str:
    """The forced setting ("auto" unless set_attention_backend changed it)."""
    return _forced_backend


@contextlib.contextmanager
def attention_backend(name: str) -> Iterator[None]:
    """Context manager form of set_attention_backend; restores the previous setting."""
    previous = _forced_backend
    set_attention_backend(name)
    try:
        yield
    finally:
        set_attention_backend(previous)


def _flash_fits(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in _FLASH_DTYPES and q.shape[-1] <= _FLASH_MAX_HEAD_DIM


def resolve_backend(q: torch.Tensor) -> str:
    """Backend that attention(q, ...) runs: "flash", "sdpa" or "math"."""
    if _forced_backend == "auto":
        return "flash" if flash_available() and _flash_fits(q) else "sdpa"
    if _forced_backend == "flash" and not _flash_fits(q):
        raise ValueError("attention backend 'flash' is forced but needs CUDA fp16/bf16 tensors with head_dim "
                         f"<= {_FLASH_MAX_HEAD_DIM}; got device={q.device}, dtype={q.dtype}, head_dim={q.shape[-1]}")
    return _forced_backend


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Reference: softmax(q k^T / sqrt(d)) v on [B, H, L, d] tensors, computed in float32."""
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        length = q.shape[-2]
        future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return (scores.softmax(dim=-1) @ v.float()).to(v.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              dropout_p: float = 0.0) -> torch.Tensor:
    """Scaled dot-product attention on [B, H, L, d] tensors with the resolved backend."""
    backend = resolve_backend(q)
    if backend == "flash":
        # flash-attn wants [B, L, H, d]
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                              dropout_p=dropout_p, causal=causal)
        return out.transpose(1, 2)
    if backend == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    if dropout_p > 0.0:
        raise ValueError(f"attention: the 'math' backend has no dropout, got dropout_p={dropout_p}")
    return explicit_attention(q, k, v, causal)


class RotaryEmbedding(nn.Module):
    """Rotates channel pairs (i, i + d/2) of q and k by angle pos * base^(-2i/d).

    The cos/sin tables stay float32 whatever dtype the network is cast to (a bf16
    table would round the angles); they follow the network's device."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
        # not persistent: derived from the config, so never stored in checkpoints
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def _apply(self, fn, recurse=True):
        tables = (self.cos, self.sin)
        super()._apply(fn, recurse)
        self.cos, self.sin = (table.to(self.cos.device) for table in tables)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, H, L, d] -> x rotated by its position along L (computed in float32)."""
        length = x.shape[-2]
        cos, sin = self.cos[:length], self.sin[:length]
        x1, x2 = x.float().chunk(2, dim=-1)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return rotated.to(x.dtype)


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, width // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = self.rotary(q), self.rotary(k)
        out = attention(q, k, v, self.causal, dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2).reshape(batch, length, width)
        return self.resid_dropout(self.proj(out))
