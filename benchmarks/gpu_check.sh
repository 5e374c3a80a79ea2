#!/usr/bin/env bash
# GPU check of ddpd._C (runs in well under 8 minutes on one GPU):
#  1. builds the extension with the CUDA kernels, for this GPU's architecture only;
#  2. runs the GPU tests of the ops (CUDA against CPU token for token, no device
#     synchronisation in compact_fixed / scatter_back / multinomial);
#  3. times the ops against torch with triton.testing.do_bench (median, after
#     warm-up) and reports achieved GB/s against a measured copy bandwidth.
# Everything is written to benchmarks/results/<device>-<date>.txt.
# `benchmarks/gpu_check.sh --dry-run` runs step 3 on CPU tensors with a wall-clock
# timer (to check the script itself on a machine without a GPU; no results file).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# Step 3 (Python): median times of ddpd and of the torch code it replaces, the
# speed-up, and the bytes the ddpd op must move as GB/s against a device copy.
timings() {
    python - "$@" <<'PY'
import sys
import time

import torch

from ddpd.ops.compact import compact, compact_fixed, scatter_back
from ddpd.ops.multinomial import multinomial

DRY_RUN = "--dry-run" in sys.argv
DEVICE = "cpu" if DRY_RUN else "cuda"


def median_ms(fn) -> float:
    if DRY_RUN:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_bandwidth_gbs() -> float:
    x = torch.empty(256 * 2**20 // 4 if not DRY_RUN else 2**20, device=DEVICE)
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x))
    return 2 * x.numel() * 4 / ms / 1e6


def line(name: str, ours, theirs, bytes_moved: int, peak: float) -> None:
    a, b = median_ms(ours), median_ms(theirs)
    gbs = bytes_moved / a / 1e6
    print(f"{name:44s} ddpd {a * 1e3:9.1f} us | torch {b * 1e3:9.1f} us | {b / a:6.2f}x | "
          f"{gbs:7.1f} GB/s ({100 * gbs / peak:4.1f}% of copy)")


def main() -> None:
    peak = copy_bandwidth_gbs()
    print(f"copy bandwidth: {peak:.0f} GB/s")
    g = torch.Generator().manual_seed(0)
    for rows, vocab in [(64, 50257), (512, 50257), (4096, 27)]:
        weights = torch.softmax(torch.randn(rows, vocab, generator=g) * 3, -1).to(DEVICE)
        ids = torch.arange(rows, device=DEVICE)
        read = weights.numel() * 4
        line(f"multinomial [{rows}, {vocab}] k=1", lambda: multinomial(weights, 1, True, seed=1, row_ids=ids, return_valid=True),
             lambda: torch.multinomial(weights, 1), read, peak)
        if vocab >= 16:
            line(f"multinomial [{rows}, {vocab}] k=16 no replacement",
                 lambda: multinomial(weights, 16, False, seed=1, row_ids=ids, return_valid=True),
                 lambda: torch.multinomial(weights, 16, replacement=False), read, peak)
    for batch, length in [(256, 1024), (4096, 1024)]:
        active = (torch.rand(batch, generator=g) < 0.6).to(DEVICE)
        tokens = torch.randint(0, 50257, (batch, length), generator=g).to(DEVICE)
        logits = torch.randn(batch, length, generator=g).to(DEVICE)
        moved = 2 * int(active.sum()) * length * (8 + 4)

        def chain():
            index = active.nonzero().squeeze(1)
            return tokens.index_select(0, index), logits.index_select(0, index)

        line(f"compact [{batch}, {length}] x2", lambda: compact(active, tokens, logits), chain, moved, peak)
        line(f"compact_fixed [{batch}, {length}] x2", lambda: compact_fixed(active, batch, tokens, logits), chain,
             2 * batch * length * 12, peak)
        (packed_tokens, packed_logits), index = compact(active, tokens, logits)
        out_tokens, out_logits = tokens.clone(), logits.clone()
        line(f"scatter_back [{batch}, {length}] x2",
             lambda: scatter_back(index, (packed_tokens, packed_logits), (out_tokens, out_logits)),
             lambda: (out_tokens.index_copy_(0, index, packed_tokens), out_logits.index_copy_(0, index, packed_logits)),
             moved, peak)


main()
PY
}

if [ "${1:-}" = "--dry-run" ]; then
    timings --dry-run
    exit 0
fi
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; nothing to do" >&2
    exit 1
fi
device=$(python -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-'))")
mkdir -p benchmarks/results
results="benchmarks/results/${device}-$(date -u +%Y-%m-%d).txt"
# Only this GPU's architecture: a quarter of the compile time of the default list.
TORCH_CUDA_ARCH_LIST=$(python -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
export TORCH_CUDA_ARCH_LIST
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

{
    echo "# ddpd GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    python -c "import torch; print('#', torch.cuda.get_device_name(), '| torch', torch.__version__, '| CUDA', torch.version.cuda)"
    echo "## build"
    start=$SECONDS
    timeout 300 python setup.py -q build_ext --inplace >/tmp/ddpd_gpu_build.log 2>&1 || { tail -50 /tmp/ddpd_gpu_build.log; exit 1; }
    echo "built in $((SECONDS - start)) s"
    python -m ddpd.ops._ext
    echo "## tests"
    timeout 240 python -m pytest tests/test_multinomial.py tests/test_compact.py tests/test_ext_build.py \
        -q -p no:cacheprovider -m "gpu or not slow" 2>&1 | tail -15
    echo "## timings (triton.testing.do_bench, median)"
    timings
} 2>&1 | tee "$results"
echo "gpu_check: results in $results"
