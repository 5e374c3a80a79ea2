"""What the Triton kernels cost an H100 in registers and shared memory, read from the
sm_90 binaries Triton builds here (cuobjdump), for the launches the ops make at the
benchmark shapes: no kernel spills registers to local memory (one exception below); sample_categorical's tile
statistics read rows that start 16-byte aligned with vector loads; sample_from_hidden's
GEMM runs on the tensor cores (wgmma) with its loads pipelined (asynchronous copies
into shared memory), and at 64 rows or fewer of H below 2048 two of its programs fit on
a multiprocessor, so one's epilogue runs while the other's loads are in flight
(ddpd.ops.sample_from_hidden.head_launch says why it matters). One exception: the head
GEMM of rows of H >= 2048 (four pipeline stages) keeps 48 bytes on the stack.

No GPU is needed: each launcher runs on CPU tensors with Triton's launch replaced by
a recorder, so the kernels, constexprs, warps and stages compiled are exactly those
the launcher passes (the grids sized for a 132-multiprocessor device), specialised as
Triton's runtime specialises a launch (16-byte aligned tensors, integers that are
multiples of 16 or equal to 1); the launcher calls are benchmarks/launch_cost.py's. Like
tests/test_op_triton_compile.py, the compilation runs in a child process without
TRITON_INTERPRET: `python tests/test_op_kernel_resources.py`.
"""
import re
import subprocess
import sys
from pathlib import Path

import torch

from hang_guard import run_compiled

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from launch_cost import (  # noqa: E402  the launcher calls at the benchmark shapes
    planner_call,
    planner_mask_call,
    record_launches,
    sample_categorical_call,
    sample_from_hidden_call,
)

REGISTERS_PER_SM, SHARED_PER_SM, SHARED_RESERVED, WARPS_PER_SM = 65536, 233472, 1024, 64  # sm_90
GPT2, LLAMA3 = 50257, 128256
TRITON_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
                 torch.int32: "i32", torch.bool: "i1"}


def test_kernels_fit_an_h100():
    result = run_compiled(__file__)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("ok ") == len(CASES), result.stdout


# --------------------------------------------------------------------- the child process


def compile_launch(kernel, args: dict, kwargs: dict):
    """Compile one recorded launch for sm_90 as Triton's runtime would specialise it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options = {name: kwargs.pop(name) for name in ("num_warps", "num_stages") if name in kwargs}
    signature, constexprs, attrs = {}, dict(kwargs), {}
    for i, name in enumerate(kernel.arg_names):
        value = kwargs.get(name, args.get(name))
        if name in kwargs or value is None or (type(value) is int and value == 1):
            signature[name], constexprs[name] = "constexpr", value
            continue
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + TRITON_DTYPES[value.dtype]
            aligned = value.data_ptr() % 16 == 0
        elif isinstance(value, bool):
            signature[name], aligned = "i1", False
        elif isinstance(value, int):
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            aligned = value % 16 == 0
        else:
            signature[name], aligned = "fp32", False
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def resources(compiled) -> dict:
    """Registers a thread, stack (spill) bytes a thread, shared memory a program, and how
    many programs fit on one sm_90 multiprocessor."""
    import tempfile

    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    shared = compiled.metadata.shared
    warps = compiled.metadata.num_warps
    per_sm = min(REGISTERS_PER_SM // (-(-registers // 8) * 8 * 32 * warps),
                 SHARED_PER_SM // (shared + SHARED_RESERVED), WARPS_PER_SM // warps)
    return dict(registers=registers, stack=stack, shared=shared, warps=warps, per_sm=per_sm)


def head_gemm(kernel) -> bool:
    return kernel.fn.__name__ == "head_tiles_kernel"


def aligned_rows(args: dict) -> bool:
    """Whether every row of the logits starts 16-byte aligned (V a multiple of 16 bytes)."""
    logits = args.get("logits_ptr")
    return logits is not None and args["V"] * logits.element_size() % 16 == 0


def check_case(name: str, call, few_rows: bool = False, spill: int = 0) -> None:
    """Every kernel `call` launches: no register spills (at most `spill` bytes of stack); the
    tile statistics read aligned rows with 16-byte vector loads; the head GEMM on wgmma with
    its loads pipelined, and two programs per multiprocessor where `few_rows`."""
    for kernel, _, args, kwargs in record_launches(call):
        compiled = compile_launch(kernel, args, dict(kwargs))
        r = resources(compiled)
        label = f"{name}: {kernel.fn.__name__} {r}"
        print(label)
        assert r["stack"] <= spill, f"{label}: spills registers"
        if kernel.fn.__name__ == "tile_stats_kernel" and aligned_rows(args):
            assert "ld.global.v4" in compiled.asm["ptx"], f"{label}: no vector loads of aligned rows"
        if head_gemm(kernel):
            assert "wgmma.mma_async" in compiled.asm["ptx"], f"{label}: not on the tensor cores"
            ttgir = compiled.asm["ttgir"]
            assert "async_copy_global_to_local" in ttgir or "async_tma_copy" in ttgir, f"{label}: loads not pipelined"
            if few_rows:
                assert r["per_sm"] >= 2, f"{label}: one program per multiprocessor"
    print(f"ok {name}")


CASES = {
    "sample_categorical 64x50257 bf16": lambda: sample_categorical_call(64, GPT2, torch.bfloat16),
    "sample_categorical 1x50257 fp32": lambda: sample_categorical_call(1, GPT2, torch.float32),
    "sample_categorical 1024x50257 bf16": lambda: sample_categorical_call(1024, GPT2, torch.bfloat16),
    "sample_categorical 4096x27 fp32": lambda: sample_categorical_call(4096, 27, torch.float32),
    "sample_categorical 64x128256 bf16": lambda: sample_categorical_call(64, LLAMA3, torch.bfloat16),
    "sample_categorical 64x50257 bf16 top-k top-p min-p": lambda: sample_categorical_call(
        64, GPT2, torch.bfloat16, top_k=50, top_p=0.9, min_p=0.05),
    "sample_categorical 64x50257 bf16 top-p": lambda: sample_categorical_call(64, GPT2, torch.bfloat16, top_p=0.9),
    "sample_categorical 64x50257 bf16 top-k": lambda: sample_categorical_call(64, GPT2, torch.bfloat16, top_k=50),
    "sample_from_hidden N=64 H=768 V=50257": lambda: sample_from_hidden_call(64, 768, GPT2),
    "sample_from_hidden N=64 H=4096 V=128256": lambda: sample_from_hidden_call(64, 4096, LLAMA3),
    "sample_from_hidden N=16 H=768 V=50257": lambda: sample_from_hidden_call(16, 768, GPT2),
    "planner_select 64x1024": lambda: planner_call(64, 1024),
    "planner_select_mask 64x1024": lambda: planner_call(64, 1024, with_mask=True),
    "planner_mask 64x1024": lambda: planner_mask_call(64, 1024),
}


if __name__ == "__main__":
    from ddpd.ops import _dispatch

    # What the launchers ask of the device, answered as for CUDA tensors on an H100: the
    # grids sized for 132 multiprocessors, and 16-bit operands on the tensor cores (CPU
    # tensors otherwise mean the interpreter, which has no bf16 arithmetic).
    _dispatch.multiprocessors = lambda device: 132
    sys.modules["ddpd.ops.sample_from_hidden"].dot_in_float32 = (
        lambda hidden, weight: weight.dtype == torch.float32 or hidden.dtype != weight.dtype)
    for case, make in CASES.items():
        # head_launch gives rows of H >= WIDE_H one program a multiprocessor and four pipeline
        # stages, at 255 registers with 48 bytes on the stack, measured faster than three
        # stages without (it says why)
        wide_head = case.startswith("sample_from_hidden") and "H=4096" in case
        check_case(case, make(), few_rows=case.startswith("sample_from_hidden") and not wide_head,
                   spill=48 if wide_head else 0)
