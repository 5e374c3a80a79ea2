"""The sm_90 binaries of the Triton launches the ops make, compiled without a GPU, and
what their loops execute.

Each launcher runs on CPU tensors with Triton's launch replaced by a recorder
(ddpd.testing.launches.record_launches), so the kernels, constexprs, warps and stages
compiled are exactly those the launcher passes, the grids sized for a 132-multiprocessor
device (answer_as_h100), and each launch is specialised as Triton's runtime specialises it
(compile_launch: 16-byte aligned tensors, integers that are multiples of 16 or equal to 1).
resources() reads a kernel's registers, stack and shared memory (cuobjdump); loops() lists
each loop of the SASS with its barriers, shared-memory accesses, shuffles, global loads and
special-function operations. A loop's length counts every branch inside it, taken or not.

CASES are the launches at the benchmark shapes: tests/ops/test_op_kernel_resources.py checks
each, benchmarks/kernel_binaries.py prints them. Run without TRITON_INTERPRET (the
interpreter compiles nothing).
"""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import tempfile

import torch

from ddpd.testing.launches import (
    GPT2,
    planner_call,
    planner_mask_call,
    sample_categorical_call,
    sample_from_hidden_call,
)

REGISTERS_PER_SM, SHARED_PER_SM, SHARED_RESERVED, WARPS_PER_SM = 65536, 233472, 1024, 64  # sm_90
LLAMA3, H100_SMS = 128256, 132
TRITON_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
                 torch.int32: "i32", torch.bool: "i1"}
COUNTED = ("BAR", "LDS", "STS", "SHFL", "LDG", "MUFU")  # opcodes counted in each loop
# and the vector loads among its LDG: 16 bytes a lane (LDG.E.128; LDG.E.64 is also an int64's load)
VECTOR_LOAD = re.compile(r"\bLDG(\.\w+)*\.128\b")
# a branch and its target, with its modifiers and the predicates or uniform register before the
# target: BRA 0x40, @P1 BRA !P2, 0x40, BRA.U !UP0, 0x40, @!P0 BRA.DIV UR4, 0x40 (BRX is indirect)
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:(?:!?U?P\w+|UR\w+),\s*)*(0x[0-9a-f]+)")


def compile_launch(kernel, args: dict, kwargs: dict):
    """Compile one recorded launch for sm_90 as Triton's runtime would specialise it.

    Args:
        kernel, args, kwargs: a launch as ddpd.testing.launches.record_launches gives it
            (the kernel, its arguments by name, its constexprs and options).

    Returns:
        Triton's compiled kernel (its cubin in .asm["cubin"], its metadata in .metadata).
    """
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


def cuobjdump(compiled, flag: str) -> str:
    """cuobjdump's output (Triton's own copy of the tool) for the compiled kernel's cubin."""
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([triton.knobs.nvidia.cuobjdump.path, flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def resources(compiled) -> dict:
    """What a compiled kernel costs an sm_90 multiprocessor.

    Args:
        compiled: a compile_launch result.

    Returns:
        {registers: a thread, stack: spill bytes a thread, shared: bytes a program, warps: a
        program, per_sm: programs that fit on one multiprocessor}.
    """
    usage = cuobjdump(compiled, "--dump-resource-usage")
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    shared = compiled.metadata.shared
    warps = compiled.metadata.num_warps
    per_sm = min(REGISTERS_PER_SM // (-(-registers // 8) * 8 * 32 * warps),
                 SHARED_PER_SM // (shared + SHARED_RESERVED), WARPS_PER_SM // warps)
    return dict(registers=registers, stack=stack, shared=shared, warps=warps, per_sm=per_sm)


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every SASS instruction."""
    found = re.findall(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*(?:/\*|$)", sass, re.M)
    return [(int(address, 16), text) for address, text in found]


def opcode(text: str) -> str:
    """The opcode of an instruction, without its predicate and modifiers (@!P0 LDG.E.64 -> LDG)."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split(" ")[0].split(".")[0]


def loops(sass: str) -> list[dict]:
    """The loops of a SASS listing, one a backward branch, innermost (shortest) first.

    Args:
        sass: cuobjdump -sass output.

    Returns:
        A dict a loop: first and last address, instructions (its length), a count of each
        COUNTED opcode, and vector (its 16-byte loads).
    """
    code = instructions(sass)
    found = []
    for address, text in code:
        target = BRANCH.search(text)
        if target is None or int(target.group(1), 16) >= address:
            continue
        first = int(target.group(1), 16)
        texts = [t for a, t in code if first <= a <= address]
        body = [opcode(t) for t in texts]
        found.append(dict(first=first, last=address, instructions=len(body),
                          **{name: body.count(name) for name in COUNTED},
                          vector=sum(1 for t in texts if VECTOR_LOAD.search(t))))
    return sorted(found, key=lambda loop: loop["instructions"])


# The launches compiled, at the benchmark shapes (tests/ops/test_op_kernel_resources.py checks each)
CASES = {
    "sample_categorical 64x50257 bf16": lambda: sample_categorical_call(64, GPT2, torch.bfloat16),
    "sample_categorical 1x50257 fp32": lambda: sample_categorical_call(1, GPT2, torch.float32),
    "sample_categorical 1024x50257 bf16": lambda: sample_categorical_call(1024, GPT2, torch.bfloat16),
    "sample_categorical 1024x50257 bf16 T=0.7": lambda: sample_categorical_call(1024, GPT2, torch.bfloat16,
                                                                               temperature=0.7),
    "sample_categorical 4096x27 fp32": lambda: sample_categorical_call(4096, 27, torch.float32),
    "sample_categorical 64x128256 bf16": lambda: sample_categorical_call(64, LLAMA3, torch.bfloat16),
    "sample_categorical 64x50257 bf16 top-k top-p min-p": lambda: sample_categorical_call(
        64, GPT2, torch.bfloat16, top_k=50, top_p=0.9, min_p=0.05),
    "sample_categorical 64x50257 bf16 top-p": lambda: sample_categorical_call(64, GPT2, torch.bfloat16, top_p=0.9),
    "sample_categorical 64x50257 bf16 top-k": lambda: sample_categorical_call(64, GPT2, torch.bfloat16, top_k=50),
    "sample_categorical 64x50257 bf16 min-p": lambda: sample_categorical_call(64, GPT2, torch.bfloat16, min_p=0.05),
    "sample_from_hidden N=64 H=768 V=50257": lambda: sample_from_hidden_call(64, 768, GPT2),
    "sample_from_hidden N=64 H=4096 V=128256": lambda: sample_from_hidden_call(64, 4096, LLAMA3),
    "sample_from_hidden N=64 H=4096 V=128256 T=0.7": lambda: sample_from_hidden_call(64, 4096, LLAMA3,
                                                                                    temperature=0.7),
    "sample_from_hidden N=16 H=768 V=50257": lambda: sample_from_hidden_call(16, 768, GPT2),
    "planner_select 64x1024": lambda: planner_call(64, 1024),
    "planner_select_mask 64x1024": lambda: planner_call(64, 1024, with_mask=True),
    "planner_mask 64x1024": lambda: planner_mask_call(64, 1024),
    # the head in one block of all 64 rows (8 warps), as the head's launch sweep tries it
    "sample_from_hidden N=64 H=768 V=50257 64-row blocks": lambda: in_row_blocks(
        64, 8, sample_from_hidden_call(64, 768, GPT2)),
}


def switched(op: str, switch: str, call, value=True):
    """call, run with ddpd.ops.<op>.<switch> set to value (a launch function)."""
    module = sys.modules[f"ddpd.ops.{op}"]  # the package exports a function of that name

    def run():
        saved = getattr(module, switch)
        setattr(module, switch, value)
        try:
            return call()
        finally:
            setattr(module, switch, saved)

    return run


def in_row_blocks(block_n: int, warps: int, call):
    """call, with the head's GEMM in blocks of block_n rows of `warps` warps (the same splits of
    the vocabulary as head_launch's, as answer_as_h100 left it)."""
    chosen = sys.modules["ddpd.ops.sample_from_hidden"].head_launch

    def launch(rows, *args, **kwargs):
        c = chosen(rows, *args, **kwargs)
        return dataclasses.replace(c, block_n=block_n, num_warps=warps, tiles_grid=(-(-rows // block_n),
                                                                                   c.tiles_grid[1]))

    return switched("sample_from_hidden", "head_launch", call, launch)


def answer_as_h100() -> None:
    """Make the launchers ask of the device what CUDA tensors on an H100 would: grids sized
    for 132 multiprocessors (categorical_launch and head_launch are the launches that read
    the count), and 16-bit
    operands on the tensor cores (CPU tensors otherwise mean the interpreter, which has no
    bf16 arithmetic)."""
    import ddpd.ops  # noqa: F401  (loads the op modules; the package exports functions of their names)

    categorical, hidden = sys.modules["ddpd.ops.sample_categorical"], sys.modules["ddpd.ops.sample_from_hidden"]
    categorical_launch, head_launch = categorical.categorical_launch, hidden.head_launch
    categorical.categorical_launch = lambda rows, vocab, sms, *rest: categorical_launch(rows, vocab, H100_SMS, *rest)
    hidden.head_launch = lambda rows, width, vocab, size, sms: head_launch(rows, width, vocab, size, H100_SMS)
    hidden.dot_in_float32 = lambda hidden, weight: weight.dtype == torch.float32 or hidden.dtype != weight.dtype
