"""Transformer hyper-parameters shared by every ddpd network.

`vocab_size` counts the INPUT symbols (V for uniform-noise inputs, V + 1 when a mask
or beginning-of-sequence id is appended); `out_dim` is the width of the output head
(V logits for denoisers, 1 for the planner, never a logit for the mask).
"""
from __future__ import annotations

import dataclasses
import numbers
import operator
from dataclasses import dataclass
from typing import Any

NORMS = ("layernorm", "rmsnorm")


def _check_int(config: TransformerConfig, name: str, minimum: int) -> None:
    """Check an int field, and store it as a Python int: config.json records it (a numpy integer
    is no JSON) and a config built from numpy integers compares equal to one built from ints."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy's integers too
        raise TypeError(f"TransformerConfig.{name}: expected int, got {type(value).__name__} {value!r}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"TransformerConfig.{name}: expected >= {minimum}, got {value}")
    object.__setattr__(config, name, value)


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"TransformerConfig.{name}: expected bool, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of a pre-norm transformer with rotary positions.

    vocab_size: number of input symbols; out_dim: logits per position;
    time_conditioned: adaLN conditioning on t in [0, 1]; causal: attend to the past only;
    norm: "layernorm" or "rmsnorm"; mlp_ratio: MLP hidden width / d_model;
    num_classes: C > 0 adds adaLN conditioning on a class label in [0, C], C being the
    null label of classifier-free guidance (0: no labels). Fields added later have
    defaults, so the config.json of an older checkpoint still loads.
    """

    vocab_size: int
    out_dim: int
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    max_seq_len: int = 256
    time_conditioned: bool = False
    causal: bool = False
    dropout: float = 0.0
    norm: str = "layernorm"
    mlp_ratio: int = 4
    num_classes: int = 0

    def __post_init__(self) -> None:
        for name, minimum in (("vocab_size", 1), ("out_dim", 1), ("d_model", 2), ("n_layers", 1), ("n_heads", 1),
                              ("max_seq_len", 1), ("mlp_ratio", 1), ("num_classes", 0)):
            _check_int(self, name, minimum)
        _check_bool("time_conditioned", self.time_conditioned)
        _check_bool("causal", self.causal)
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"TransformerConfig.d_model: expected a multiple of n_heads={self.n_heads}, got {self.d_model}")
        if (self.d_model // self.n_heads) % 2 != 0:
            raise ValueError(
                "TransformerConfig: rotary embeddings need an even head dimension d_model / n_heads, "
                f"got {self.d_model} / {self.n_heads} = {self.d_model // self.n_heads}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, numbers.Real):  # numpy's floats too
            raise TypeError(f"TransformerConfig.dropout: expected float, got {type(self.dropout).__name__}")
        object.__setattr__(self, "dropout", float(self.dropout))  # config.json holds no numpy float32
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"TransformerConfig.dropout: expected in [0, 1), got {self.dropout}")
        if self.norm not in NORMS:
            raise ValueError(f"TransformerConfig.norm: expected one of {NORMS}, got {self.norm!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def conditioned(self) -> bool:
        """True when the trunk has adaLN conditioning (on t, on a class label or both)."""
        return self.time_conditioned or self.num_classes > 0

    def to_dict(self) -> dict:
        """The fields as a plain dict (what a checkpoint's config.json stores).

        Returns:
            field name -> value.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TransformerConfig:
        """The TransformerConfig of a dict written by to_dict.

        Args:
            d: field name -> value; fields with defaults may be absent.

        Returns:
            The validated TransformerConfig.

        Raises:
            TypeError: `d` is not a dict, or a field of the wrong type.
            ValueError: unknown or missing fields, or a field out of range.
        """
        if not isinstance(d, dict):
            raise TypeError(f"TransformerConfig.from_dict: expected dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TransformerConfig.from_dict: unknown fields {unknown}; known fields {sorted(known)}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.name not in d)
        if missing:
            raise ValueError(f"TransformerConfig.from_dict: missing required fields {missing}")
        return cls(**d)
