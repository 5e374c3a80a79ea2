#!/usr/bin/env bash
# GPU check of ddpd, every kernel and the end-to-end sampler, in under 8 minutes on
# one GPU:
#  1. build: installs ddpd editable (pip --no-deps --no-build-isolation --no-index:
#     nothing is downloaded), which maps kernels/ to ddpd.kernels and compiles
#     ddpd._C with its CUDA kernels, for this GPU's architecture only (`python -m ddpd.ops
#     --cuda` fails the run without them);
#  2. tests: every test marked gpu (tests/ops/test_op_gpu.py: the compiled Triton kernels
#     draw for draw against the CPU path, CUDA graph capture, torch.compile; the CUDA
#     ops of ddpd._C; the models and the sampler on CUDA);
#  3. timings: benchmarks/gpu_timings.py, each op checked against its torch
#     reference on the device, then, for sample_categorical (with and without
#     top-k / top-p / min-p), sample_from_hidden and multinomial, eager and
#     CUDA-graph-replay medians of ddpd and of the best torch code, the ratios, one
#     read of the input at the measured copy bandwidth and ddpd's host cost; the
#     other ops (rotary and norm among them) as GB/s and peak memory; the fused sampler step
#     against the reference step; then benchmarks/host_cost.py --cuda (per-call host cost of
#     every op against its raw torch.ops call, and where sample_categorical's goes);
#  4. kernel profile: benchmarks/kernel_profile.py --ncu, one call each of the draws whose
#     time the timings leave unexplained, under Nsight Compute (memory throughput,
#     occupancy, warp stalls), where ncu is installed;
#  5. sampling: benchmarks/gpu_sampling.py, whole sampling runs of the bundled model
#     (reference, fused float32, fused bfloat16, the default fused run with CUDA
#     graphs), the kernels of a fused step, and a GPT-2-size pair's fused step against
#     its networks; last, the default run with torch.compile'd networks (batches 64
#     and 512).
#  6. parallel decoding (only when --only names it: an estimated 4 minutes, beyond the 8 of the
#     other parts): first, within 45 s, the GPU tests of the code it times (the commit policies
#     under CUDA graphs against the reference path, philox_uniform's kernel:
#     tests/sampling/test_sampling_gpu.py, tests/ops/test_op_gpu.py, -k selected); then
#     benchmarks/gpu_parallel.py, samples/s and tokens/s at batches 1 and 64
#     of the bundled model and of a GPT-2-size planner + mask denoiser (L = 1024): today's
#     default DDPD run against DDPD's two error-budget policies of the frontier and the mask
#     loop's MaskGIT and confidence threshold at 64 and 128 network passes (MaskGIT at 64
#     eagerly too), the configurations of `ddpd-eval frontier`.
# The build and Triton compile checks (tests/meta/test_ext_build.py,
# tests/ops/test_op_triton_compile.py) run in CI, not here.
# Each part runs under `timeout` inside a total budget of DDPD_GPU_BUDGET_S seconds
# (default 480) and prints its elapsed time; a part that fails or runs out is
# reported and the next part still runs (except after a failed build). The exit
# status is 1 if any part failed. Everything goes to benchmarks/results/<device>.txt, the
# device's latest log (an earlier run's is in git; a run with --only writes
# <device>-<parts>.txt instead; where $OUT is a folder, as on a lent device machine, the log
# is written there too as the run goes, so that a call cut short still returns it, and the
# rows file is copied there at the end if the run wrote rows), and the timings' and whole
# runs' comparisons go, as rows, into benchmarks/results/<device>.jsonl (benchmarks/rows.py:
# a run replaces the rows of the cases it timed; benchmarks/report.py makes
# docs/performance.md's tables of them). Python: $PYTHON, default python3.
# Tests that run the Triton kernels on CPU tensors (the interpreter) are not run
# here: they need TRITON_INTERPRET=1 set before the kernels are imported, which
# would also put the CUDA tests in the interpreter; CI runs them.
#
# `--only PARTS` runs the build and then only the named parts (a comma list of tests,
# timings, host, sampling, profile, parallel), for a rerun that fits what is left of a device lease; the
# results file's second line records the command. `DDPD_GPU_BUDGET_S=240 benchmarks/gpu_check.sh
# --only parallel` (the call's timeout_s 270) is the second call of the lease planned in
# docs/text8/README.md, "One GPU lease for both device scripts", after docs/text8/gpu_train.sh;
# within that budget the parts' limits shrink to what is left of it.
# `--tree-hash` prints a hash of the sources (ddpd/, kernels/, csrc/, benchmarks/, tests/;
# Python, C++, CUDA and shell files) and exits: a results file names its commit and this hash,
# which tells which checkout ran where the copy's .git is not the checkout's.
# `benchmarks/gpu_check.sh --dry-run` needs no GPU: it prints the commands of steps
# 1-2 and runs steps 3-5 on CPU tensors of tiny shapes with a wall-clock timer and
# no time limits (tests/tools/test_gpu_check_script.py runs it in CI), writing to
# ${TMPDIR:-/tmp}/ddpd-gpu-check-dry-run.txt and .jsonl instead of the results files.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUDGET=${DDPD_GPU_BUDGET_S:-480}
export PYTHONUNBUFFERED=1
DRY_RUN=0
# tree_hash: the first 12 hex digits of a hash of every source file's path and contents
# (benchmarks/rows.py's source_hash, which the results rows name too)
tree_hash() {
    $PY benchmarks/rows.py --tree-hash
}
# shellcheck source=benchmarks/carried_setuptools.sh
. benchmarks/carried_setuptools.sh
DEFAULT_PARTS=tests,timings,host,sampling,profile
ONLY=$DEFAULT_PARTS
USAGE="usage: $0 [--dry-run] [--only tests,timings,host,sampling,profile,parallel] [--tree-hash]"
ARGS="$*"
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help)
            echo "$USAGE"
            sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'  # the comment above
            exit 0 ;;
        --dry-run) DRY_RUN=1 ;;
        --tree-hash)
            tree_hash
            exit 0 ;;
        --only)
            ONLY=${2:-}
            parts='(tests|timings|host|sampling|profile|parallel)'
            if [[ ! $ONLY =~ ^$parts(,$parts)*$ ]]; then
                echo "$USAGE" >&2
                exit 2
            fi
            shift ;;
        *)
            echo "$USAGE" >&2
            exit 2 ;;
    esac
    shift
done
# wanted PART: whether --only names it
wanted() { [[ ,$ONLY, == *,$1,* ]]; }

# part NAME LIMIT CMD...: run CMD under `timeout`, for at most LIMIT seconds and what
# is left of the budget; report its outcome and elapsed time; return its status.
part() {
    local name=$1 limit=$2 left=$((BUDGET - SECONDS)) start=$SECONDS rc=0
    shift 2
    ((limit > left)) && limit=$left
    echo "## $name (limit ${limit} s)"
    if ((DRY_RUN)) && [[ $name = build || $name = extension || $name = "gpu tests"* ]]; then
        printf 'dry run, would run:'
        printf ' %q' "$@"
        echo
        return 0
    fi
    if ((DRY_RUN)); then  # no time limits: a dry run checks the script, on a CPU of any speed
        "$@" || rc=$?
    elif ((limit < 10)); then
        echo "## $name: SKIPPED, the time budget is spent"
        return 1
    else
        timeout --kill-after=10 "$limit" "$@" || rc=$?
    fi
    case $rc in
        0) echo "## $name: passed in $((SECONDS - start)) s" ;;
        124 | 137) echo "## $name: TIMED OUT after $((SECONDS - start)) s" ;;
        *) echo "## $name: FAILED (exit $rc) after $((SECONDS - start)) s" ;;
    esac
    return $rc
}

check() {
    local failed=0
    local rev
    rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    # a copy of a working tree can carry an older .git: say when the files are not that commit's
    [[ $rev != unknown ]] && ! git diff --quiet HEAD -- 2>/dev/null && rev="$rev, with files that differ from it"
    echo "# ddpd GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $rev"
    echo "# command: benchmarks/gpu_check.sh $ARGS, budget ${BUDGET} s, $(nproc) cores, $($PY --version 2>&1)"
    echo "# sources $(tree_hash) (benchmarks/gpu_check.sh --tree-hash in a checkout prints its own)"
    if ((!DRY_RUN)); then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null |
            sed 's/^/# /'
    fi
    # pip -q prints the compiler's output only when the build fails.
    ((DRY_RUN)) || use_carried_setuptools "$PY"
    # --cuda: without its CUDA kernels ddpd._C leaves the ops to their torch references, and the
    # parts would time those as ddpd's
    part build 150 $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . &&
        part extension 40 $PY -m ddpd.ops --cuda || { echo "gpu_check: the build failed"; return 1; }
    local gpu_tests workers=()
    gpu_tests=$(grep -l "pytest.mark.gpu" tests/*/test_*.py | tr '\n' ' ')
    # Four pytest processes (pytest-xdist, where installed) share the GPU, so that the tests'
    # CPU work (Triton compiling each kernel variant, the samplers' Python) runs on four
    # cores: one process does not finish within the part's limit.
    $PY -c "import xdist" 2>/dev/null && workers=(-n 4)
    # shellcheck disable=SC2086  # one word per test file
    wanted tests && { part "gpu tests" 160 $PY -m pytest $gpu_tests -m "gpu and not slow" -q -rs -p no:cacheprovider \
        ${workers[@]+"${workers[@]}"} --durations=15 --continue-on-collection-errors || failed=1; }
    local mode=() host=(--cuda) rows_to=()
    ((DRY_RUN)) && mode=(--dry-run) && host=() && rows_to=(--rows "${results%.txt}.jsonl")
    # 240 s: the launch sweeps at the end of the timings take most of it
    wanted timings && { part timings 240 $PY benchmarks/gpu_timings.py ${mode[@]+"${mode[@]}"} \
        ${rows_to[@]+"${rows_to[@]}"} || failed=1; }
    wanted host && { part "host cost" 45 $PY benchmarks/host_cost.py ${host[@]+"${host[@]}"} \
        --profile sample_categorical || failed=1; }
    # The kernel profile before the whole runs: a run whose budget runs out loses the longest
    # part, not the short one.
    local profiler=(--ncu)
    ((DRY_RUN)) && profiler=(--dry-run)
    wanted profile && { part "kernel profile" 90 $PY benchmarks/kernel_profile.py "${profiler[@]}" || failed=1; }
    wanted sampling && { part sampling 230 $PY benchmarks/gpu_sampling.py --compile ${mode[@]+"${mode[@]}"} \
        ${rows_to[@]+"${rows_to[@]}"} || failed=1; }
    # The code the parallel part times (the commit policies in CUDA graphs; the Philox kernel,
    # which the reference path runs) is tested on the GPU first: a failure is reported, the
    # timings still run.
    wanted parallel && { part "gpu tests of the timed code" 45 $PY -m pytest tests/sampling/test_sampling_gpu.py \
        tests/ops/test_op_gpu.py -m gpu -k "philox or budget or maskgit or threshold" -q -rs -p no:cacheprovider \
        --durations=5 || failed=1; }
    # 300 s: an estimate, not measured yet (the GPT-2-size mask loop at batch 64 takes the most;
    # the rows print as they are measured, so a part cut short keeps those done)
    wanted parallel && { part "parallel decoding" 300 $PY benchmarks/gpu_parallel.py ${mode[@]+"${mode[@]}"} ||
        failed=1; }
    echo "# total $SECONDS s"
    return $failed
}

if ((DRY_RUN)); then
    results=${TMPDIR:-/tmp}/ddpd-gpu-check-dry-run.txt
else
    if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check: no CUDA device visible to torch; nothing to do (--dry-run checks this script)" >&2
        exit 1
    fi
    device=$($PY -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
    mkdir -p benchmarks/results
    results="benchmarks/results/${device}.txt"  # the latest whole run's; git keeps the ones before
    # a run of some parts keeps its own log: it must not replace the whole run's
    [[ $ONLY != "$DEFAULT_PARTS" ]] && results="benchmarks/results/${device}-${ONLY//,/-}.txt"
    # Only this GPU's architecture: a quarter of the compile time of the default list.
    TORCH_CUDA_ARCH_LIST=$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
    export TORCH_CUDA_ARCH_LIST
    export MAX_JOBS=${MAX_JOBS:-$(nproc)}
fi
logs=("$results")
# handed back: on the device machine, what is under $OUT comes back
handed_back=0
((!DRY_RUN)) && [ -n "${OUT:-}" ] && [ -d "$OUT" ] && handed_back=1
# the log under $OUT as it goes: a call cut short by its timeout or the lease's end still returns it
((handed_back)) && logs+=("$OUT/$(basename "$results")")
# the rows file's time and size before the run: handed back only if this run wrote rows (the
# parallel part writes none, and the file in the checkout is an earlier run's)
rows=benchmarks/results/${device:-}.jsonl
rows_before=$(stat -c '%y %s' "$rows" 2>/dev/null)
check "$@" 2>&1 | tee "${logs[@]}"
status=${PIPESTATUS[0]}
echo "gpu_check: results in $results"
if ((handed_back)); then
    echo "gpu_check: the log written to $OUT as the run went"
    if [ -f "$rows" ] && [ "$(stat -c '%y %s' "$rows")" != "$rows_before" ]; then
        cp "$rows" "$OUT/" && echo "gpu_check: its rows copied to $OUT"
    else
        echo "gpu_check: this run wrote no rows ($rows unchanged): none copied to $OUT"
    fi
fi
exit "$status"
