"""Every Triton kernel of the fused sampling ops compiles to a GPU binary (sm_80 and
sm_90 cubin through Triton's own ptxas), with and without its optional inputs.

The interpreter tests check what the kernels compute; this checks what only the
compiler sees (types of the Philox words, constexpr branches on None inputs, dot
shapes, shared memory), on machines without a GPU. The signatures are those the
launchers in ddpd.ops pass (tests/ops/test_op_kernel_resources.py compiles the launches
themselves, specialised as on a GPU, and reads their registers). The test process
imports the kernels for the interpreter (TRITON_INTERPRET=1), so the compilation runs
in a child process without it: `python tests/ops/test_op_triton_compile.py`."""

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ddpd.kernels import (
    norm as norm_kernels,
    rng as rng_kernels,
    rotary as rotary_kernels,
    sample_categorical as categorical_kernels,
    sample_from_hidden as hidden_kernels,
)
from ddpd.kernels.planner_mask import planner_mask_kernel
from ddpd.kernels.planner_select import planner_select_kernel
from ddpd.ops.rng import PHILOX_BLOCK
from ddpd.ops.sample_from_hidden import head_launch
from hang_guard import run_compiled

TARGETS = [GPUTarget("cuda", 80, 32), GPUTarget("cuda", 90, 32)]
SEED = {"seed_lo": "i32", "seed_hi": "i32", "offset_lo": "i32", "offset_hi": "i32"}


def counters(present: bool) -> dict:
    """The seed and offset words, and their tensors (int64 pointers) when present."""
    return dict(SEED, seed_ptr=optional(present, "*i64"), offset_ptr=optional(present, "*i64"))


def compile_kernel(kernel, types: dict, constexprs: dict, target, **options) -> dict:
    """Compile `kernel`; types: argument -> Triton type, or None for an absent input;
    options: num_warps, num_stages as the launcher passes them."""
    signature, values = {}, dict(constexprs)
    for name, kind in types.items():
        signature[name] = "constexpr" if kind is None else kind
        if kind is None:
            values[name] = None
    signature.update({name: "constexpr" for name in constexprs})
    missing = set(kernel.arg_names) - set(signature)
    assert not missing, f"signature lacks {missing}"
    return triton.compile(ASTSource(kernel, signature, values), target=target, options=options).asm


def optional(present: bool, kind: str):
    return kind if present else None


def sample_categorical_case(target, present):
    """Every optional input and output present (bf16 logits, per-row controls, a threshold,
    the margin confidence and the log-probability), or none (float32, scalars); the
    threshold search with and without per-row tensors."""
    masks = dict(exclude_ptr="*i64", n_exclude="i32", exclude_row_ptr=optional(present, "*i64"),
                 allowed_ptr=optional(present, "*i1"))
    temp = dict(temperature="fp32", temperature_ptr=optional(present, "*fp32"))
    logits = dict(logits_ptr="*bf16" if present else "*fp32", V="i32")
    stats = dict(logits, n_tiles="i32", tiles_per_split="i32", **temp, **masks, tau_ptr=optional(present, "*fp32"),
                 stats_ptr="*fp32")
    assert "cubin" in compile_kernel(categorical_kernels.tile_stats_kernel, stats,
                                     dict(TILE=256, TILES_PER_CHUNK=4, ALIGN=8 if present else 4, SECOND=present,
                                          ENTROPY=not present, UNIT=not present),
                                     target)
    finish = dict(logits, n_tiles="i32", **temp, **masks, tau_ptr=optional(present, "*fp32"),
                  noise_ptr=optional(present, "*fp32"), row_ids_ptr=optional(present, "*i64"), **counters(present),
                  stats_ptr=optional(present, "*fp32"), tokens_ptr="*i64", valid_ptr="*i1", logprob_ptr="*fp32",
                  confidence_ptr="*fp32")
    assert "cubin" in compile_kernel(categorical_kernels.finish_kernel, finish,
                                     dict(TILE=256, BLOCK_J=256, BLOCK_T=256, SINGLE_TILE=not present, LOGPROB=present,
                                          CONFIDENCE=2 if present else 3), target)
    thresholds = dict(logits, **temp, **masks, top_k="i64", top_k_ptr=optional(present, "*i64"), top_p="fp32",
                      top_p_ptr=optional(present, "*fp32"), log_min_p="fp32", log_min_p_ptr=optional(present, "*fp32"),
                      tau_ptr="*fp32", scratch_ptr="*fp32", n_groups="i32", capacity="i32")
    assert "cubin" in compile_kernel(categorical_kernels.thresholds_kernel, thresholds,
                                     dict(TOP_K=True, TOP_P=True, MIN_P=present, BLOCK=1024, SCAN_BLOCK=4096,
                                          GROUP=64), target, num_warps=8)


def planner_select_case(target, present):
    with_mask, softmax = present, not present
    types = dict(logits_ptr="*fp16" if present else "*fp32", D="i32", k="i32", tau="fp32", eps="fp32",
                 noise_ptr=optional(present, "*fp32"), mask_noise_ptr=optional(present and with_mask, "*fp32"),
                 row_ids_ptr=optional(present, "*i64"), **counters(present), mask_offset_lo="i32",
                 mask_offset_hi="i32", mask_offset_ptr=optional(present and with_mask, "*i64"),
                 x_ptr=optional(with_mask, "*i64"), mask_id="i64", positions_ptr="*i64", sum_p_ptr="*fp32",
                 stop_ptr="*i1", masked_ptr=optional(with_mask, "*i64"), z_ptr=optional(with_mask, "*i1"),
                 count_ptr=optional(with_mask, "*i64"))
    asm = compile_kernel(planner_select_kernel, types, dict(SOFTMAX=softmax, WITH_MASK=with_mask, BLOCK_D=1024),
                         target)
    assert "cubin" in asm


def planner_mask_case(target, present):
    types = dict(logits_ptr="*fp32", x_ptr="*i64", positions_ptr="*i64", D="i32", k="i32", mask_id="i64",
                 noise_ptr=optional(present, "*fp32"), row_ids_ptr=optional(present, "*i64"), **counters(present),
                 masked_ptr="*i64", z_ptr="*i1", count_ptr="*i64")
    asm = compile_kernel(planner_mask_kernel, types, dict(BLOCK_D=256, BLOCK_K=4), target)
    assert "cubin" in asm


def sample_from_hidden_case(target, present):
    """bf16 operands on the tensor cores with a bias and every optional input and output,
    or float32 operands as three TF32 products with none; the block shapes and options of
    head_launch at N = 64, H = 768, V = 50257; the logits kernel of the truncating calls."""
    launch = head_launch(64, 768, 50257, 2 if present else 4, 132)
    matrices = dict(h_ptr="*bf16" if present else "*fp32", w_ptr="*bf16" if present else "*fp32",
                    b_ptr=optional(present, "*bf16"))
    stream = dict(noise_ptr=optional(present, "*fp32"), row_ids_ptr=optional(present, "*i64"), **counters(present))
    stats = dict(stats_ptr="*fp32")
    outputs = dict(tokens_ptr="*i64", valid_ptr="*i1", logprob_ptr="*fp32", confidence_ptr="*fp32")
    types = dict(matrices, N="i32", V="i32", H="i32", n_tiles="i32", tiles_per_split="i32", temperature="fp32",
                 temperature_ptr=optional(present, "*fp32"), exclude_ptr="*i64", n_exclude="i32",
                 exclude_row_ptr=optional(present, "*i64"), allowed_ptr=optional(present, "*i1"), **stream, **stats,
                 **outputs)
    flags = dict(LOGPROB=present, CONFIDENCE=2 if present else 3)
    asm = compile_kernel(hidden_kernels.head_tiles_kernel, types,
                         dict(TILE=256, BLOCK_N=launch.block_n, BLOCK_H=launch.block_h, DOT_F32=not present,
                              SINGLE_TILE=False, UNIT=present, **flags), target,
                         num_warps=launch.num_warps, num_stages=launch.num_stages)
    assert "cubin" in asm
    assert "mma" in asm["ptx"]  # the tensor cores: bf16 operands, or float32 as three TF32 products
    if present and target.arch >= 90:
        assert "wgmma" in asm["ptx"]
    masks = dict(exclude_ptr="*i64", n_exclude="i32", exclude_row_ptr=optional(present, "*i64"),
                 allowed_ptr=optional(present, "*i1"))
    finish = dict(matrices, H="i32", **masks, n_tiles="i32", V="i32", temperature="fp32",
                  temperature_ptr=optional(present, "*fp32"), **stream, **stats, **outputs)
    assert "cubin" in compile_kernel(hidden_kernels.finish_kernel, finish,
                                     dict(BLOCK_T=256, TILE=256, BLOCK_N=16,
                                          BLOCK_H=launch.block_h, DOT_F32=not present, **flags), target)
    logits = dict(matrices, N="i32", V="i32", H="i32", out_ptr="*fp32")
    assert "cubin" in compile_kernel(hidden_kernels.head_logits_kernel, logits,
                                     dict(TILE=256, BLOCK_N=launch.block_n, BLOCK_H=launch.block_h,
                                          DOT_F32=not present), target, num_warps=launch.num_warps,
                                     num_stages=launch.num_stages)


def rotary_case(target, present):
    """bfloat16 (the rounding written out) or float32 q, compiled as the launcher compiles it:
    without fused multiply-adds, which would round the rotation differently from torch."""
    types = dict(x_ptr="*bf16" if present else "*fp32", cos_ptr="*fp32", sin_ptr="*fp32",
                 out_ptr="*bf16" if present else "*fp32", heads="i32", length="i32", half="i32", stride_b="i64",
                 stride_h="i64", stride_l="i64")
    asm = compile_kernel(rotary_kernels.rotary_kernel, types, dict(BLOCK_L=128, BLOCK_HALF=32, BF16=present),
                         target, enable_fp_fusion=False)
    assert "cubin" in asm and "fma" not in asm["ptx"]


def norm_case(target, present):
    """bfloat16 x with adaLN (the bundled denoiser's norms) or float32 x without affine or
    modulation, a GPT-2-width row in each program."""
    element = "*bf16" if present else "*fp32"
    types = dict(x_ptr=element, weight_ptr="*fp32", bias_ptr="*fp32", shift_ptr=element, scale_ptr=element,
                 out_ptr=element, rows="i32", length="i32", width="i32", eps="fp32", stride_x="i64",
                 stride_shift="i64", stride_scale="i64")
    flags = dict(BLOCK_ROWS=4, BLOCK_W=1024, RMS=not present, HAS_WEIGHT=present, HAS_BIAS=present,
                 MODULATED=present, BF16=present, BF16_MODULATION=present)
    assert "cubin" in compile_kernel(norm_kernels.norm_kernel, types, flags, target, num_warps=8)


def philox_uniform_case(target, present):
    """ddpd.ops.rng.philox_uniform on CUDA: the seed and offset as words, or as tensors (a call
    captured in a CUDA graph reads them there)."""
    types = dict(rows_ptr="*i64", cols_ptr="*i64", n_cols="i32", **counters(present), out_ptr="*fp32")
    assert "cubin" in compile_kernel(rng_kernels.philox_uniform_kernel, types, dict(BLOCK=PHILOX_BLOCK), target)


CASES = [sample_categorical_case, planner_select_case, planner_mask_case, sample_from_hidden_case, rotary_case,
         norm_case, philox_uniform_case]


@pytest.mark.integration
def test_kernels_compile_for_gpus():
    result = run_compiled(__file__)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("compiled") == len(CASES) * len(TARGETS) * 2


if __name__ == "__main__":
    for case in CASES:
        for target in TARGETS:
            for present in (True, False):
                case(target, present)
                print(f"compiled {case.__name__} sm{target.arch} optional inputs present={present}")
