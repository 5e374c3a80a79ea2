"""The plain torch references of the ops: one name per law, the same arguments and result
types as the op of that name in ddpd.ops, and the same tokens from the same uniforms.
Written for clarity, not speed: tests hold the kernels to them, benchmarks time against them.

`categorical` is the categorical law itself on [N, V] logits from explicit uniforms, the one
every token draw of the package (op, reference, sampler) is tested against. Each law:
docs/ops/<op>.md.
"""
from ddpd.ops.bernoulli import bernoulli_reference as bernoulli
from ddpd.ops.compact import compact_fixed_reference as compact_fixed, scatter_back_reference as scatter_back
from ddpd.ops.multinomial import (
    categorical_from_weights_reference as categorical_from_weights,
    multinomial_from_logits_reference as multinomial_from_logits,
    multinomial_reference as multinomial,
)
from ddpd.ops.norm import norm_reference as norm
from ddpd.ops.planner_mask import planner_mask_reference as planner_mask
from ddpd.ops.planner_select import (
    planner_select_mask_reference as planner_select_mask,
    planner_select_reference as planner_select,
)
from ddpd.ops.rng import philox_uniform_reference as philox_uniform
from ddpd.ops.rotary import rotary_reference as rotary
from ddpd.ops.sample_categorical import (
    categorical_reference as categorical,
    sample_categorical_reference as sample_categorical,
)
from ddpd.ops.sample_from_hidden import sample_from_hidden_reference as sample_from_hidden

__all__ = [
    "bernoulli",
    "categorical",
    "categorical_from_weights",
    "compact_fixed",
    "multinomial",
    "multinomial_from_logits",
    "norm",
    "philox_uniform",
    "planner_mask",
    "planner_select",
    "planner_select_mask",
    "rotary",
    "sample_categorical",
    "sample_from_hidden",
    "scatter_back",
]
