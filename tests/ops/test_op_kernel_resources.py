"""What the Triton kernels cost an H100 in registers and shared memory, read from the
sm_90 binaries Triton builds here (cuobjdump), for the launches the ops make at the
benchmark shapes: no kernel spills registers to local memory; sample_categorical's tile
statistics read every row with 16-byte vector loads, wherever it starts; sample_from_hidden's
GEMM runs on the tensor cores (wgmma) with its loads pipelined (asynchronous copies
into shared memory), and at 64 rows or fewer of H below 2048 two of its programs fit on
a multiprocessor, so one's epilogue runs while the other's loads are in flight
(ddpd.ops.sample_from_hidden.head_launch says why it matters); rows of H >= 2048 run one
program a multiprocessor (blocks of 64 rows, four pipeline stages).

No GPU is needed: each launcher runs on CPU tensors with Triton's launch replaced by
a recorder, so the kernels, constexprs, warps and stages compiled are exactly those
the launcher passes (the grids sized for a 132-multiprocessor device), specialised as
Triton's runtime specialises a launch (16-byte aligned tensors, integers that are
multiples of 16 or equal to 1); the launcher calls are ddpd.testing.launches', the
cases, the compilation and the reading of the binaries ddpd.testing.sm90's (the
last test runs that script). Like tests/ops/test_op_triton_compile.py, the compilation runs in a child
process without TRITON_INTERPRET: `python tests/ops/test_op_kernel_resources.py`.
"""
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

from ddpd.testing.launches import record_launches  # the launches a call makes
from ddpd.testing.sm90 import CASES, answer_as_h100, compile_launch, resources  # sm_90 binaries
from hang_guard import run_compiled

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.integration
def test_kernels_fit_an_h100():
    result = run_compiled(__file__)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("ok ") == len(CASES), result.stdout


@pytest.mark.integration
def test_kernel_binaries_refuses_a_case_that_names_none():
    """A misspelt --case compiled nothing and exited 0: refused, with the cases' names."""
    result = run_compiled(str(BENCHMARKS / "kernel_binaries.py"), "--case", "top_p")
    assert result.returncode == 2, result.stdout[-4000:] + result.stderr[-4000:]
    assert "'top_p'" in result.stderr and "top-p" in result.stderr, result.stderr
    assert "sm_90 binaries" not in result.stdout, result.stdout


@pytest.mark.integration
def test_kernel_binaries_reads_the_loops_of_the_launches():
    """benchmarks/kernel_binaries.py on the 1024-row draw: each kernel's resources and the
    counts of its loops, which show the tile statistics (one warp a program) reducing each
    tile within the warp: no barrier in any of their loops, shuffles instead."""
    result = run_compiled(str(BENCHMARKS / "kernel_binaries.py"), "--case", "1024x50257")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    kernels, name = {}, None
    for line in result.stdout.splitlines()[1:]:
        if line.startswith("  loop "):
            kernels[name].append(line)
        else:
            name = line.split(": ")[1].split(" ")[0]
            kernels[name] = [line]
    assert set(kernels) == {"tile_stats_kernel", "finish_kernel"}, result.stdout
    stats = kernels["tile_stats_kernel"]
    assert "'warps': 1" in stats[0] and len(stats) > 1
    assert any(" SHFL 0 " not in loop for loop in stats[1:])
    if Version(version("triton")).release >= (3, 9):
        # Triton 3.6 (torch 2.11's, the H200 runs of benchmarks/results) moves the loaded tile
        # through shared memory in the loop, a barrier each chunk; 3.9 does not
        assert all(" BAR 0 " in loop for loop in stats[1:]), result.stdout


# --------------------------------------------------------------------- the child process


def head_gemm(kernel) -> bool:
    return kernel.fn.__name__ == "head_tiles_kernel"


def allowed_spill(kernel: str) -> int:
    """Bytes of stack a kernel may use: none, but under Triton before 3.6 (torch 2.11's, the
    oldest the benchmarks measure), where Triton 3.4 (torch 2.8) gives the top-k threshold
    search 128 registers and 24 bytes of stack at 8 warps (docs/kernels.md)."""
    old = Version(version("triton")).release < (3, 6)
    return 24 if old and kernel == "thresholds_kernel" else 0


def check_case(name: str, call, few_rows: bool = False) -> None:
    """Every kernel `call` launches: no register spills (no stack); the
    tile statistics read with 16-byte vector loads; the head GEMM on wgmma with
    its loads pipelined, and two programs per multiprocessor where `few_rows`."""
    for kernel, _, args, kwargs in record_launches(call):
        compiled = compile_launch(kernel, args, dict(kwargs))
        r = resources(compiled)
        label = f"{name}: {kernel.fn.__name__} {r}"
        print(label)
        assert r["stack"] <= allowed_spill(kernel.fn.__name__), f"{label}: spills registers"
        if kernel.fn.__name__ == "tile_stats_kernel":  # rows at any offset, read through aligned windows
            assert "ld.global.v4" in compiled.asm["ptx"], f"{label}: no 16-byte vector loads"
        if head_gemm(kernel):
            assert "wgmma.mma_async" in compiled.asm["ptx"], f"{label}: not on the tensor cores"
            ttgir = compiled.asm["ttgir"]
            assert "async_copy_global_to_local" in ttgir or "async_tma_copy" in ttgir, f"{label}: loads not pipelined"
            if few_rows:
                assert r["per_sm"] >= 2, f"{label}: one program per multiprocessor"
    print(f"ok {name}")


if __name__ == "__main__":
    answer_as_h100()
    for case, make in CASES.items():
        # head_launch gives rows of H >= WIDE_H one program a multiprocessor and four pipeline
        # stages, measured faster (it says why); so does a block of all 64 rows, which the
        # head's launch sweep times
        wide_head = case.startswith("sample_from_hidden") and "H=4096" in case
        check_case(case, make(), few_rows=case.startswith("sample_from_hidden") and not wide_head
                   and "64-row blocks" not in case)
