"""Public sampling ops: each a torch.library custom op with a plain torch reference
beside it (`<name>_reference`, same semantics, same tokens from the same noise).

One op, one name in each tree: ddpd/ops/<op>.py (checks, reference, launchers, fake
kernel, the public function), kernels/<op>.py (its Triton kernels, installed as
ddpd.kernels.<op>), csrc/cpu/<op>.cpp and csrc/cuda/<op>.cu (its C++ and CUDA
kernels in ddpd._C); docs/architecture.md draws the map.

CUDA tensors run Triton kernels (ddpd.kernels) or CUDA kernels of ddpd._C; CPU
tensors run the C++ kernels of ddpd._C. Randomness is counter-based (ddpd.ops.rng):
every op takes seed/offset/generator/row_ids, or explicit `noise=` uniforms.
`load_extension()` loads ddpd._C ahead of the first op call (compiling it on first use
where the install did not build it; see ddpd.ops._ext). Beside the sampling ops,
`rotary` (the rotary position embedding) and `norm` (LayerNorm or RMSNorm with the
adaLN modulation) are the networks' own kernels, no randomness.
"""
from ddpd.ops import _ext
from ddpd.ops.bernoulli import bernoulli, bernoulli_reference
from ddpd.ops.compact import compact_fixed, compact_fixed_reference, scatter_back, scatter_back_reference
from ddpd.ops.multinomial import (
    categorical_from_weights,
    categorical_from_weights_reference,
    multinomial,
    multinomial_from_logits,
    multinomial_from_logits_reference,
    multinomial_reference,
)
from ddpd.ops.norm import norm, norm_reference
from ddpd.ops.planner_mask import planner_mask, planner_mask_reference
from ddpd.ops.planner_select import (
    planner_select,
    planner_select_mask,
    planner_select_mask_reference,
    planner_select_reference,
)
from ddpd.ops.rng import philox_uniform
from ddpd.ops.rotary import rotary, rotary_reference
from ddpd.ops.sample_categorical import (
    categorical_reference,
    noise_width,
    sample_categorical,
    sample_categorical_reference,
)
from ddpd.ops.sample_from_hidden import sample_from_hidden, sample_from_hidden_reference


def load_extension():
    """Load ddpd._C (torch.ops.ddpd.*), compiling it first where the install did not build it;
    the ops load it themselves at their first call, this does it ahead of time."""
    return _ext.load()


__all__ = [
    "load_extension",
    "bernoulli",
    "bernoulli_reference",
    "categorical_from_weights",
    "categorical_from_weights_reference",
    "compact_fixed",
    "compact_fixed_reference",
    "scatter_back",
    "scatter_back_reference",
    "multinomial",
    "multinomial_reference",
    "multinomial_from_logits",
    "multinomial_from_logits_reference",
    "categorical_reference",
    "noise_width",
    "norm",
    "norm_reference",
    "philox_uniform",
    "planner_mask",
    "planner_mask_reference",
    "planner_select",
    "planner_select_reference",
    "planner_select_mask",
    "planner_select_mask_reference",
    "rotary",
    "rotary_reference",
    "sample_categorical",
    "sample_categorical_reference",
    "sample_from_hidden",
    "sample_from_hidden_reference",
]
