#!/usr/bin/env bash
# Compile check of the CUDA sources of ddpd._C with this machine's nvcc; needs no GPU.
#  1. every csrc/cuda/*.cu with `nvcc -c` for a few architectures (plain CUDA C++,
#     no torch headers), failing on any error;
#  2. when torch is importable, a syntax check of the torch binding files
#     csrc/cuda/*.cpp against torch's headers (a CPU build of torch ships the CUDA
#     headers but not the generated c10/cuda/impl/cuda_cmake_macros.h, which is
#     stubbed; a file that needs a CUDA library header absent from the toolkit,
#     such as cusparse.h, is reported and skipped).
# Exits 0 with a message when nvcc is absent. DDPD_CUDA_ARCHS overrides the
# architectures (default "80 90").
set -uo pipefail
cd "$(dirname "$0")/.."

nvcc_bin=${NVCC:-$(command -v nvcc || true)}
if [ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc_bin=/usr/local/cuda/bin/nvcc; fi
if [ -z "$nvcc_bin" ]; then
    echo "nvcc_check: nvcc not found, skipping the CUDA compile check"
    exit 0
fi
echo "nvcc_check: $("$nvcc_bin" --version | tail -1)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gencode=()
for arch in ${DDPD_CUDA_ARCHS:-80 90}; do gencode+=(-gencode "arch=compute_${arch},code=sm_${arch}"); done

status=0
shopt -s nullglob
for source in csrc/cuda/*.cu; do
    if "$nvcc_bin" -std=c++17 -O2 --fmad=false -Icsrc "${gencode[@]}" -c "$source" -o "$work/$(basename "$source").o"; then
        echo "nvcc_check: ok      $source"
    else
        echo "nvcc_check: FAILED  $source"
        status=1
    fi
done

bindings=(csrc/cuda/*.cpp)
if [ ${#bindings[@]} -gt 0 ] && python -c "import torch" 2>/dev/null; then
    mapfile -t torch_includes < <(python -c "from torch.utils.cpp_extension import include_paths; print('\n'.join(include_paths()))")
    python_include=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    # nvcc knows its own include folder (it may be a wrapper script outside the toolkit).
    cuda_include=$(cd "$work" && touch probe.cu && "$nvcc_bin" --dryrun -c probe.cu 2>&1 |
        sed -n 's/.*INCLUDES="-I\([^"]*\)".*/\1/p' | head -1)
    mkdir -p "$work/stub/c10/cuda/impl"
    echo '#define C10_CUDA_BUILD_SHARED_LIBS' > "$work/stub/c10/cuda/impl/cuda_cmake_macros.h"
    flags=(-std=c++20 -fsyntax-only -Wall -Icsrc "-I$python_include" "-I$cuda_include")
    for dir in "${torch_includes[@]}"; do flags+=("-I$dir"); done
    flags+=("-idirafter" "$work/stub")  # only used where torch lacks the generated header
    for source in "${bindings[@]}"; do
        if log=$(c++ "${flags[@]}" "$source" 2>&1); then
            echo "nvcc_check: ok      $source (syntax, against torch headers)"
        elif grep -q "fatal error: .*: No such file or directory" <<<"$log"; then
            echo "nvcc_check: skipped $source: $(grep -m1 -o 'fatal error: .*' <<<"$log")"
        else
            echo "$log"
            echo "nvcc_check: FAILED  $source (syntax, against torch headers)"
            status=1
        fi
    done
fi
exit $status
