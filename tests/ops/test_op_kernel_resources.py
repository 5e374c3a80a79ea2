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
import re
import sys
import types
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from packaging.version import Version

import ddpd.ops  # noqa: F401  (loads the op modules, which sm90 reaches through sys.modules)
from ddpd.testing import sm90
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


# A cuobjdump -sass excerpt: an inner loop (0x0040-0x0080) inside an outer one (0x0020-0x00c0), a short
# loop after them (0x00c0-0x00d0) and a forward branch, which is no loop; each instruction ends with its encoding.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/                   S2R R0, SR_TID.X ;                  /* 0x000fe20000000f00 */
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;    /* 0x000fe20000000f00 */
        /*0030*/              @!P0 BRA 0xa0 ;                          /* 0x000fe20000000f00 */
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;       /* 0x000fe20000000f00 */
        /*0050*/                   LDS R8, [R0] ;                      /* 0x000fe20000000f00 */
        /*0060*/                   SHFL.BFLY PT, R9, R8, 0x1, 0x1f ;   /* 0x000fe20000000f00 */
        /*0070*/              @!P0 LDG.E.64 R10, desc[UR4][R2.64] ;    /* 0x000fe20000000f00 */
        /*0080*/               @P1 BRA !P2, 0x40 ;                     /* 0x000fe20000000f00 */
        /*0090*/                   MUFU.EX2 R12, R11 ;                 /* 0x000fe20000000f00 */
        /*00a0*/                   STS [R0], R12 ;                     /* 0x000fe20000000f00 */
        /*00b0*/              @!P1 LDG.E.ENL2.128 R4, desc[UR4][R2.64] ; /* 0x000fe20000000f00 */
        /*00c0*/                   BRA 0x20 ;                          /* 0x000fe20000000f00 */
        /*00d0*/                   BRA 0xc0 ;                          /* 0x000fe20000000f00 */
        /*00e0*/                   EXIT ;                              /* 0x000fe20000000f00 */
"""


def test_instructions_are_read_with_their_addresses_and_without_trailing_comments():
    code = sm90.instructions(SASS)
    assert len(code) == 15
    assert code[0] == (0x0, "MOV R1, c[0x0][0x28]")
    assert code[3] == (0x30, "@!P0 BRA 0xa0")
    assert code[-1] == (0xe0, "EXIT")
    assert sm90.instructions("        /*001*/  MOV R1, R2 ; /* 0x0 */\n") == []  # addresses have four digits or more
    assert sm90.instructions("        /*0010*/  EXIT ;\n") == [(0x10, "EXIT")]  # a line without its encoding


@pytest.mark.parametrize("text,expected", [("@!P0 LDG.E.64 R10, desc[UR4][R2.64]", "LDG"), ("@UP1 BRA 0x40", "BRA"),
                                           ("BAR.SYNC.DEFER_BLOCKING 0x0", "BAR"), ("@P12 MUFU.EX2 R1, R2", "MUFU"),
                                           ("EXIT", "EXIT")])
def test_an_opcode_is_read_without_its_predicate_or_modifiers(text, expected):
    assert sm90.opcode(text) == expected


def test_loops_are_the_backward_branches_innermost_first_with_their_counts():
    short, inner, outer = sm90.loops(SASS)
    assert short == dict(first=0xc0, last=0xd0, instructions=2, BAR=0, LDS=0, STS=0, SHFL=0, LDG=0, MUFU=0, vector=0)
    assert inner == dict(first=0x40, last=0x80, instructions=5, BAR=1, LDS=1, STS=0, SHFL=1, LDG=1, MUFU=0, vector=0)
    assert outer == dict(first=0x20, last=0xc0, instructions=11, BAR=1, LDS=1, STS=1, SHFL=1, LDG=3, MUFU=1,
                         vector=2)
    forward = SASS.replace("BRA 0x20", "BRA 0xd0").replace("BRA !P2, 0x40", "BRA 0x80").replace("BRA 0xc0", "BRA 0xe0")
    assert sm90.loops(forward) == []
    uniform = SASS.replace("@P1 BRA !P2, 0x40", "BRA !UP2, 0x40")  # a branch on a uniform predicate
    assert sm90.loops(uniform) == [short, inner, outer]


def test_a_branch_with_modifiers_closes_a_loop_as_a_plain_one_does():
    """cuobjdump writes a divergent branch BRA.DIV with its uniform register (@!P0 BRA.DIV UR4, 0x40)
    and a uniform one BRA.U (BRA.U !UP0, 0x40): read as branches, backward ones are loops."""
    short, inner, outer = sm90.loops(SASS)
    divergent = SASS.replace("@P1 BRA !P2, 0x40", "@!P0 BRA.DIV UR4, 0x40")
    assert sm90.loops(divergent) == [short, inner, outer]
    uniform = SASS.replace("@P1 BRA !P2, 0x40", "BRA.U !UP0, 0x40")
    assert sm90.loops(uniform) == [short, inner, outer]
    forward = SASS.replace("@P1 BRA !P2, 0x40", "@!P0 BRA.DIV UR4, 0x90")
    assert sm90.loops(forward) == [short, outer]
    indirect = SASS.replace("@P1 BRA !P2, 0x40", "BRX R2 -0x90")  # an indirect branch is no loop read here
    assert sm90.loops(indirect) == [short, outer]


def compiled_with(monkeypatch, registers: int, stack: int, shared: int, warps: int):
    usage = f"Function kernel:\n REG:{registers} STACK:{stack} SHARED:0 LOCAL:0 CONSTANT[0]:904 TEXTURE:0"
    monkeypatch.setattr(sm90, "cuobjdump", lambda compiled, flag: usage if flag == "--dump-resource-usage" else "")
    return types.SimpleNamespace(metadata=types.SimpleNamespace(shared=shared, num_warps=warps))


@pytest.mark.parametrize("registers,shared,warps,per_sm", [
    (41, 0, 4, 10),  # registers: 48 a thread (allocated by eight) x 128 threads, 10 programs of 65536
    (40, 0, 4, 12),
    (64, 0, 4, 8),  # 64 x 128 threads: exactly 8 programs of 65536 registers
    (32, 100000, 4, 2),  # shared memory: a program reserves 1 KiB more than it uses
    (32, 115713, 4, 1),
    (32, 115712, 4, 2),
    (16, 0, 8, 8),  # warps: 64 a multiprocessor
])
def test_resources_fit_the_programs_a_multiprocessor_holds_under_each_limit(monkeypatch, registers, shared, warps,
                                                                            per_sm):
    r = resources(compiled_with(monkeypatch, registers, 24, shared, warps))
    assert r == dict(registers=registers, stack=24, shared=shared, warps=warps, per_sm=per_sm)


def test_compile_launch_specialises_as_tritons_runtime(monkeypatch):
    """Constexprs, None and integers equal to 1 are compiled in; 16-byte aligned tensors and
    integers that are multiples of 16 are marked divisible; integers outside int32 are int64."""
    import triton
    import triton.compiler

    compiled = []
    monkeypatch.setattr(triton.compiler, "ASTSource", lambda fn, signature, constexprs, attrs: (fn, signature,
                                                                                                 constexprs, attrs))
    monkeypatch.setattr(triton, "compile", lambda src, target, options: compiled.append((src, target, options)))
    names = ["x", "y", "n", "m", "big", "low", "too_low", "flag", "scale", "none", "one", "BLOCK"]
    kernel = types.SimpleNamespace(arg_names=names)
    base = torch.empty(16)
    args = dict(x=base, y=base[2:], n=32, m=2**31 - 1, big=2**31, low=-2**31, too_low=-2**31 - 1, flag=True,
                scale=0.5, none=None, one=1)
    kwargs = dict(BLOCK=128, num_warps=4, num_stages=3)
    compile_launch(kernel, args, kwargs)
    ((_, signature, constexprs, attrs), target, options), = compiled
    assert signature == dict(x="*fp32", y="*fp32", n="i32", m="i32", big="i64", low="i32", too_low="i64", flag="i1",
                             scale="fp32", none="constexpr", one="constexpr", BLOCK="constexpr")
    assert constexprs == dict(none=None, one=1, BLOCK=128)
    assert attrs == {(i,): [["tt.divisibility", 16]] for i in (0, 2, 4, 5)}
    assert options == dict(num_warps=4, num_stages=3) and kwargs == dict(BLOCK=128)
    assert (target.backend, target.arch, target.warp_size) == ("cuda", 90, 32)
    compile_launch(kernel, dict(args, x=base.to(torch.bfloat16), n=1, one=16), {})
    ((_, signature, constexprs, attrs), _, options), = compiled[1:]
    assert signature["x"] == "*bf16" and signature["n"] == "constexpr" and signature["one"] == "i32"
    assert constexprs == dict(n=1, none=None, BLOCK=None) and options == {}  # a missing constexpr is None
    assert set(attrs) == {(0,), (4,), (5,), (10,)}


def test_compile_launch_names_each_tensor_dtype_as_triton_does(monkeypatch):
    import triton
    import triton.compiler

    compiled = []
    monkeypatch.setattr(triton.compiler, "ASTSource", lambda fn, signature, constexprs, attrs: signature)
    monkeypatch.setattr(triton, "compile", lambda src, target, options: compiled.append(src))
    dtypes = dict(f32=torch.float32, bf16=torch.bfloat16, f16=torch.float16, i64=torch.int64, i32=torch.int32,
                  b=torch.bool)
    kernel = types.SimpleNamespace(arg_names=list(dtypes))
    compile_launch(kernel, {name: torch.empty(4, dtype=dtype) for name, dtype in dtypes.items()}, {})
    assert compiled == [dict(f32="*fp32", bf16="*bf16", f16="*fp16", i64="*i64", i32="*i32", b="*i1")]


def test_cuobjdump_reads_the_whole_cubin_with_tritons_tool(monkeypatch):
    import triton

    tool, seen = triton.knobs.nvidia.cuobjdump.path, []  # found (and its version read) before run is replaced

    def run(command, capture_output, text, check):
        with open(command[2], "rb") as f:
            seen.append((command[:2], f.read(), capture_output, text, check))
        return types.SimpleNamespace(stdout="REG:40 STACK:0")

    monkeypatch.setattr(sm90.subprocess, "run", run)
    compiled = types.SimpleNamespace(asm={"cubin": b"\x7fELF" + bytes(range(64))})
    assert sm90.cuobjdump(compiled, "-sass") == "REG:40 STACK:0"
    assert seen == [([tool, "-sass"], compiled.asm["cubin"], True, True, True)]


def test_cases_launch_the_shapes_their_names_give(monkeypatch):
    """Each case's name states its rows and vocabulary (and H): the builders are given those."""
    for builder in ("sample_categorical_call", "sample_from_hidden_call", "planner_call", "planner_mask_call"):
        monkeypatch.setattr(sm90, builder, lambda *args, _name=builder, **kwargs: (_name, args, kwargs))
    monkeypatch.setattr(sm90, "in_row_blocks", lambda block_n, warps, call: (block_n, warps, call))
    assert (sm90.LLAMA3, sm90.H100_SMS) == (128256, 132)
    for name, make in CASES.items():
        made = make()
        if "64-row blocks" in name:
            assert made[:2] == (64, 8), name
            made = made[2]
        builder, args, kwargs = made
        assert name.startswith(builder.removesuffix("_call").replace("planner_call", "planner_select")), name
        if builder == "sample_from_hidden_call":
            numbers = [int(n) for n in re.findall(r"[NHV]=(\d+)", name)]
        else:
            numbers = [int(n) for n in name.split(" ")[1].split("x")]  # rows x vocabulary (or length)
        assert list(args[:len(numbers)]) == numbers, name
        if "T=0.7" in name:
            assert kwargs["temperature"] == 0.7, name
        if builder == "sample_categorical_call":
            assert args[2] == (torch.float32 if "fp32" in name else torch.bfloat16), name
            controls = {"top-k": ("top_k", 50), "top-p": ("top_p", 0.9), "min-p": ("min_p", 0.05)}
            assert {k: v for k, v in kwargs.items() if k != "temperature"} == dict(
                value for key, value in controls.items() if key in name), name
        if builder == "planner_call":
            assert kwargs == (dict(with_mask=True) if "mask" in name else {}), name


def test_switched_sets_the_ops_switch_for_the_call_only(monkeypatch):
    module = sys.modules["ddpd.ops.sample_from_hidden"]
    original = module.head_launch
    seen = []
    assert sm90.switched("sample_from_hidden", "head_launch", lambda: seen.append(module.head_launch) or 7, None)() == 7
    assert seen == [None] and module.head_launch is original

    def fails():
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError):
        sm90.switched("sample_from_hidden", "head_launch", fails)()
    assert module.head_launch is original


def test_row_blocks_change_the_heads_block_of_rows_and_warps_only():
    module = sys.modules["ddpd.ops.sample_from_hidden"]
    chosen = module.head_launch(100, 768, 50257, 2, 132)
    launch = sm90.in_row_blocks(32, 2, lambda: module.head_launch(100, 768, 50257, 2, 132))()
    assert (launch.block_n, launch.num_warps, launch.tiles_grid) == (32, 2, (4, chosen.tiles_grid[1]))
    assert launch.block_h == chosen.block_h and launch.num_stages == chosen.num_stages


def test_answering_as_an_h100_sizes_grids_for_132_multiprocessors_and_dots_16_bit_operands(monkeypatch):
    categorical, hidden = sys.modules["ddpd.ops.sample_categorical"], sys.modules["ddpd.ops.sample_from_hidden"]
    for module, name in ((categorical, "categorical_launch"), (hidden, "head_launch"), (hidden, "dot_in_float32")):
        monkeypatch.setattr(module, name, getattr(module, name))  # put back after the test
    categorical_launch, head_launch = categorical.categorical_launch, hidden.head_launch
    answer_as_h100()
    for sms in (4, 114):
        assert categorical.categorical_launch(1024, 50257, sms) == categorical_launch(1024, 50257, 132)
        assert hidden.head_launch(1024, 768, 50257, 2, sms) == head_launch(1024, 768, 50257, 2, 132)
    assert categorical_launch(1024, 50257, 132) != categorical_launch(1024, 50257, 114)
    assert head_launch(1024, 768, 50257, 2, 132) != head_launch(1024, 768, 50257, 2, 114)
    # the launch's other arguments go through
    assert categorical.categorical_launch(64, 50257, 4, 2) == categorical_launch(64, 50257, 132, 2)
    assert categorical_launch(64, 50257, 132, 2) != categorical_launch(64, 50257, 132)
    assert hidden.head_launch(64, 768, 50257, 4, 8) == head_launch(64, 768, 50257, 4, 132)  # a float32 weight
    assert head_launch(64, 768, 50257, 4, 132) != head_launch(64, 768, 50257, 2, 132)
    bf16, fp32 = torch.empty(2, dtype=torch.bfloat16), torch.empty(2)
    assert not hidden.dot_in_float32(bf16, bf16)
    assert hidden.dot_in_float32(fp32, fp32) and hidden.dot_in_float32(bf16, fp32) and hidden.dot_in_float32(fp32, bf16)


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


@pytest.fixture
def kernel_binaries(monkeypatch):
    """benchmarks/kernel_binaries.py with two cases of one kernel each and their binaries stubbed."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kernel_binaries

    made, compiled, h100 = [], [], []

    class Kernel:
        def __init__(self, name):
            self.fn = types.SimpleNamespace(__name__=name)

    def case(name):
        return lambda: made.append(name) or name

    def compile_launch(kernel, args, kwargs):
        compiled.append((kernel.fn.__name__, args, kwargs))
        return kernel.fn.__name__

    loop = {"first": 0x20, "last": 0x1c0, "instructions": 27, "BAR": 1, "LDS": 2, "STS": 3, "SHFL": 4, "LDG": 5,
            "vector": 6, "MUFU": 7}
    monkeypatch.setattr(kernel_binaries, "CASES", {"draw top-p": case("draw top-p"), "heads 1024": case("heads 1024")})
    monkeypatch.setattr(kernel_binaries, "record_launches", lambda call: [(Kernel(f"{call}_kernel"), [3, 1],
                                                                          {"x": 1}, (("BLOCK", 16),))])
    monkeypatch.setattr(kernel_binaries, "compile_launch", compile_launch)
    monkeypatch.setattr(kernel_binaries, "resources", lambda compiled: {"registers": 40})
    monkeypatch.setattr(kernel_binaries, "cuobjdump", lambda compiled, flag: (compiled, flag))
    monkeypatch.setattr(kernel_binaries, "loops", lambda sass: [loop] if sass[1] == "-sass" else [])
    monkeypatch.setattr(kernel_binaries, "answer_as_h100", lambda: h100.append(1))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernel_binaries.made, kernel_binaries.compiled, kernel_binaries.h100 = made, compiled, h100
    return kernel_binaries


def test_kernel_binaries_prints_each_kernels_resources_and_loops_of_the_cases_named(kernel_binaries, monkeypatch,
                                                                                     capsys):
    monkeypatch.setattr(sys, "argv", ["kernel_binaries.py", "--case", "top-p"])
    assert kernel_binaries.main() == 0
    head, *lines = capsys.readouterr().out.splitlines()
    assert kernel_binaries.h100 == [1] and kernel_binaries.made == ["draw top-p"]  # only the case named is made
    assert kernel_binaries.compiled == [("draw top-p_kernel", {"x": 1}, {"BLOCK": 16})]
    assert head.startswith("sm_90 binaries, triton ") and "BAR, LDS, STS, SHFL, LDG, MUFU (LDG: in" in head
    assert lines == ["draw top-p: draw top-p_kernel grid (3, 1) {'registers': 40}",
                     "  loop 0x0020-0x01c0:    27 instructions, BAR 1 LDS 2 STS 3 SHFL 4 LDG 5 (6) MUFU 7"]


def test_kernel_binaries_without_a_case_reads_every_case(kernel_binaries, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kernel_binaries.py"])
    assert kernel_binaries.main() == 0
    assert kernel_binaries.made == ["draw top-p", "heads 1024"]


@pytest.mark.parametrize("case, value, refusal", [
    ("top_p", None, "kernel_binaries: --case 'top_p' is in no case's name; the cases: draw top-p; heads 1024\n"),
    ("1024", " True ", "kernel_binaries: unset TRITON_INTERPRET (the interpreter compiles nothing)\n"),
    ("", "1", "kernel_binaries: unset TRITON_INTERPRET (the interpreter compiles nothing)\n"),
    ("", "yes", "kernel_binaries: unset TRITON_INTERPRET (the interpreter compiles nothing)\n"),
])
def test_kernel_binaries_refuses_a_case_in_no_name_and_the_interpreter(kernel_binaries, monkeypatch, capsys, case,
                                                                        value, refusal):
    monkeypatch.setattr(sys, "argv", ["kernel_binaries.py", "--case", case])
    if value is not None:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert kernel_binaries.main() == 2
    assert capsys.readouterr() == ("", refusal)
    assert kernel_binaries.made == [] and kernel_binaries.h100 == []


def test_kernel_binaries_runs_with_the_interpreter_off(kernel_binaries, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kernel_binaries.py", "--case", "1024"])
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert kernel_binaries.main() == 0
    assert kernel_binaries.made == ["heads 1024"]
