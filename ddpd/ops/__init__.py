"""The fused ops under the samplers: token draws, the planner's selection and mask, row
compaction, and the networks' rotary embedding and norm. Each is a torch.library custom op
with a plain torch reference of the same name in ddpd.ops.reference.

CUDA tensors run Triton kernels (ddpd.kernels) or CUDA kernels of ddpd._C; CPU tensors run the
C++ kernels of ddpd._C. Randomness is counter-based (Philox per row): every random op takes
seed/offset/generator/row_ids, or explicit `noise=` uniforms. Ops return the NamedTuples of
ddpd.ops.results; token draws take their controls as a DrawControls.
docs/architecture.md maps the files; docs/ops/<op>.md states each op's law and method.
"""
import warnings

from ddpd.ops import _ext, reference
from ddpd.ops._dispatch import Watcher
from ddpd.ops.bernoulli import bernoulli
from ddpd.ops.compact import compact_fixed, scatter_back
from ddpd.ops.controls import DrawControls
from ddpd.ops.multinomial import categorical_from_weights, multinomial, multinomial_from_logits
from ddpd.ops.norm import norm
from ddpd.ops.planner_mask import planner_mask
from ddpd.ops.planner_select import planner_select, planner_select_mask
from ddpd.ops.results import Compacted, Draw, Mask, Plan, Selection
from ddpd.ops.rng import philox_uniform
from ddpd.ops.rotary import rotary
from ddpd.ops.sample_categorical import noise_width, sample_categorical
from ddpd.ops.sample_from_hidden import sample_from_hidden


def load_extension():
    """Load ddpd._C (torch.ops.ddpd.*) ahead of the first op call.

    The ops load it themselves at their first call; this compiles it first where the
    install did not build it.

    Returns:
        The loaded extension module.

    Raises:
        RuntimeError: the extension could not be loaded or built (its first line says why).
    """
    return _ext.load()


def __getattr__(name: str):
    """The former `<op>_reference` names, kept one release: ddpd.ops.reference.<op> now."""
    if name.endswith("_reference"):
        law = name.removesuffix("_reference")
        if law in reference.__all__:
            warnings.warn(f"ddpd.ops.{name} is deprecated; use ddpd.ops.reference.{law}", DeprecationWarning,
                          stacklevel=2)
            return getattr(reference, law)
    raise AttributeError(f"module 'ddpd.ops' has no attribute {name!r}")


__all__ = [
    "Compacted",
    "Draw",
    "DrawControls",
    "Mask",
    "Plan",
    "Selection",
    "Watcher",
    "bernoulli",
    "categorical_from_weights",
    "compact_fixed",
    "load_extension",
    "multinomial",
    "multinomial_from_logits",
    "noise_width",
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
