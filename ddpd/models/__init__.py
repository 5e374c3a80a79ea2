"""ddpd networks: planner, denoisers, single uniform model and AR judge on one transformer trunk;
attention kernel dispatch; bf16/fp16 sampling precision; adapters for denoisers trained elsewhere."""
from ddpd.models.adapters import MaskDenoiserAdapter, MDLMSubsDenoiser, SEDDAbsorbingDenoiser
from ddpd.models.ar import ARModel
from ddpd.models.attention import (
    ATTENTION_BACKENDS,
    FLASH_KERNELS,
    attention_backend,
    flash_available,
    get_attention_backend,
    record_attention,
    resolve_backend,
    set_attention_backend,
)
from ddpd.models.backbone import Backbone
from ddpd.models.base import HeadModel
from ddpd.models.config import TransformerConfig
from ddpd.models.factory import MODEL_CLASSES, MODEL_KINDS, build_model, config_for, count_parameters
from ddpd.models.mask_denoiser import MaskDenoiser
from ddpd.models.planner import Planner
from ddpd.models.precision import DTYPE_CHOICES, compile_for_sampling, prepare_for_sampling, resolve_dtype
from ddpd.models.uniform_denoiser import UniformDenoiser
from ddpd.models.uniform_model import UniformModel

__all__ = [
    "ARModel", "ATTENTION_BACKENDS", "Backbone", "DTYPE_CHOICES", "FLASH_KERNELS", "HeadModel", "MDLMSubsDenoiser",
    "MODEL_CLASSES", "MODEL_KINDS", "MaskDenoiser", "MaskDenoiserAdapter", "Planner", "SEDDAbsorbingDenoiser",
    "TransformerConfig", "UniformDenoiser", "UniformModel", "attention_backend", "build_model", "compile_for_sampling",
    "config_for", "count_parameters", "flash_available", "get_attention_backend", "prepare_for_sampling",
    "record_attention", "resolve_backend", "resolve_dtype", "set_attention_backend",
]
