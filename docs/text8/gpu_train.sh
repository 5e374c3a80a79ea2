#!/usr/bin/env bash
# One GPU call that trains the networks of the next text8 bundle, at once on one GPU,
# on text8-mini's books.txt and wiki.txt (13.2 M characters), and evaluates them:
#
#   docs/text8/gpu_train.sh           # on the GPU: stops itself within BUDGET_S seconds
#   SMOKE=1 docs/text8/gpu_train.sh   # the same stages on the CPU, tiny networks (a dry run)
#   docs/text8/gpu_train.sh --plan    # print the settings, the time plan and the training
#                                     # commands; run nothing
#
# On a lent device machine it is the first of two calls of one lease, as planned in
# docs/text8/README.md, "One GPU lease for both device scripts": BUDGET_S=480 (the default),
# the call's timeout_s 540.
#
# Exit status: 0 when every stage passed, 3 when they did but a network's training was
# stopped by the deadline before its --max-time (the same command again continues it), 2 for
# a wrong setting (nothing ran), 1 when a stage failed.
#
# Stages, each under `timeout` within the budget; everything printed goes to
# $RESULTS/gpu_train.log:
#  1. build: pip install -e . (no downloads; ddpd._C with its CUDA kernels for this GPU)
#     where ddpd is not installed, `python -m ddpd.ops --cuda` (on a GPU, installed or not:
#     without the kernels the ops run their torch references), then a check of the attention
#     kernel that training runs (bf16 autocast, flash attention: both automatic in ddpd-train
#     on a CUDA GPU);
#  2. corpus: $DATA_DIR/books.txt, a space, $DATA_DIR/wiki.txt -> $RUNS/corpus.txt, split
#     90/5/5 by position by every tool: validation and test are the end of wiki.txt, which the
#     new networks never train on. The bundled networks trained on wiki.txt's first 90%, half
#     of the corpus's test split: they are compared on wiki.txt's own test split only;
#     then a training check: every network, tiny, 2 steps on this device with an evaluation
#     and a save, and an ELBO of the tiny pair (about 20 s), so that a GPU-only failure stops
#     the call before the training stage spends it;
#  3. train: $NETWORKS at once (ddpd-train --max-time TRAIN_SECONDS each, what the budget
#     leaves), stopped by SIGTERM at the stage's deadline if they run late (ddpd-train then
#     saves a checkpoint); a network whose $RUNS/NAME holds a checkpoint is continued with
#     --resume (its settings, --max-time included, come from the checkpoint): on the same
#     machine only, as the checkpoints (about 260 MB) are not handed back; a network that left
#     no checkpoint is reported and the others go on;
#  4. export: float16 copies of the weights in $RUNS/float16, the precision the package ships;
#  5. eval: the training table (steps, tokens/s of the networks training at once, losses); the
#     ELBO of the new networks on wiki.txt's test split with the settings of docs/text8/elbo.md
#     (256 sequences, 4 Monte-Carlo samples, seed 0), of the bundled pair there with the same
#     code (elbo.md measured 4.322 bits per character with the planner's mask), and of the new
#     networks on the corpus's test split; from a bundle of the new networks,
#     `ddpd-sample --fused` (what it prints by default) and `ddpd-sample --model uniform --fused`;
#  6. pack (where $OUT is set, as on the device machine): $OUT/gpu_train.log (written as the
#     run goes), $OUT/float16.tar.part-* (the float16 copies in parts of 15 MiB, right after
#     stage 4) and $OUT/results.tar ($RESULTS).
# The device call carries data and .whl, a setuptools wheel that the build takes where the
# image's is older than 77 (benchmarks/carried_setuptools.sh).
#
# Settings, from the environment:
#   BUDGET_S       seconds the whole script may take (default 480, the lease plan's; a stage
#                  stopped at the budget's end may take 20 s more: give the device call a
#                  timeout_s 60 s above BUDGET_S)
#   TRAIN_SECONDS  ddpd-train --max-time of every network (default: the budget less the build,
#                  the corpus and RESERVE_S; runs still training a third of RESERVE_S before
#                  the budget's end are stopped there, as with exit status 3)
#   RESERVE_S      seconds kept from training for the start of training, its evaluations and
#                  stages 4-6 (default 170)
#   DATA_DIR       the folder holding books.txt and wiki.txt (default data/ in the checkout,
#                  git-ignored; copy text8-mini's books.txt and wiki.txt there)
#   NETWORKS       the networks to train (default "planner mask-denoiser uniform"; also
#                  uniform-denoiser and ar, the judge of ddpd-eval quality)
#   RUNS           checkpoints and training logs (default runs/text8-gpu, git-ignored)
#   RESULTS        what to commit: logs, tables, samples (default
#                  docs/text8/logs/train-<device>-<UTC date>, -2, -3, ... if it exists)
#   ELBO_SEQUENCES test sequences of each ELBO (default 256, as in docs/text8/elbo.md)
#   DEVICE         cuda (default; the run stops at once without a CUDA device), cpu or auto
#   PYTHON         the interpreter (default python3)
#   SMOKE=1        tiny networks (d_model 32, one layer), 20 s of training, small evaluations,
#                  on the CPU, RUNS and RESULTS in ${TMPDIR:-/tmp}/ddpd-gpu-train-smoke
#   TRAIN_ARGS     more ddpd-train arguments for every new network (a later one wins)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
SMOKE=${SMOKE:-0}
BUDGET_S=${BUDGET_S:-480}
RESERVE_S=${RESERVE_S:-170}
DATA_DIR=${DATA_DIR:-$ROOT/data}
NETWORKS=${NETWORKS:-planner mask-denoiser uniform}
ELBO_SEQUENCES=${ELBO_SEQUENCES:-256}
DEVICE=${DEVICE:-cuda}
TRAIN_ARGS=${TRAIN_ARGS:-}
# shellcheck source=benchmarks/carried_setuptools.sh
. benchmarks/carried_setuptools.sh
PLAN=0
INCOMPLETE=()  # networks whose training the deadline stopped

# name: ddpd-train arguments. Sizes: the package ships planner + mask denoiser + single uniform
# model in at most 45 MB of float16 (ddpd.pretrained.MAX_BUNDLE_BYTES) and all its assets in
# under 50 MB, so the pair is d_model 256 x 6 layers (4.7 M + 7.4 M parameters, 24.2 MB) and
# the uniform model, which replaces both, 8 layers (9.7 M, 19.5 MB). Time is not the limit: five
# networks of 4 layers sharing an H200 trained at 480-570 k tokens/s each (training.md).
declare -A NETWORK=(
    [planner]="planner --d-model 256 --n-layers 6 --n-heads 4 --batch-size 128 --lr 1e-3"
    [mask-denoiser]="mask-denoiser --d-model 256 --n-layers 6 --n-heads 4 --batch-size 128 --lr 1e-3"
    [uniform]="uniform --d-model 256 --n-layers 8 --n-heads 4 --batch-size 128 --lr 1e-3"
    [uniform-denoiser]="uniform-denoiser --d-model 256 --n-layers 6 --n-heads 4 --batch-size 128 --lr 1e-3"
    [ar]="ar --d-model 384 --n-layers 4 --n-heads 6 --dropout 0.2 --batch-size 64 --lr 1e-3"
)
SAMPLE_ARGS=()
if [ "$SMOKE" = 1 ]; then
    SMOKE_DIR=${TMPDIR:-/tmp}/ddpd-gpu-train-smoke
    RUNS=${RUNS:-$SMOKE_DIR/runs}
    RESULTS=${RESULTS:-$SMOKE_DIR/results}
    TRAIN_SECONDS=${TRAIN_SECONDS:-20}
    TRAIN_ARGS="--d-model 32 --n-layers 1 --n-heads 2 --batch-size 8 $TRAIN_ARGS"
    ELBO_SEQUENCES=8
    DEVICE=cpu
    SAMPLE_ARGS=(--num-samples 2 --steps 64)
fi
RUNS=${RUNS:-$ROOT/runs/text8-gpu}
STEPS=20000  # a ceiling: the clock (--max-time) ends the runs
die() {
    echo "gpu_train: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case $1 in
        --plan) PLAN=1 ;;
        -h | --help)
            sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
            exit 0 ;;
        *) die "unknown argument $1 (usage: $0 [--plan])" ;;
    esac
    shift
done

# Settings are checked before anything runs: a GPU run must not find out late.
[[ $BUDGET_S =~ ^[0-9]+$ ]] || die "BUDGET_S must be a whole number of seconds, got '$BUDGET_S'"
[[ $RESERVE_S =~ ^[0-9]+$ ]] || die "RESERVE_S must be a whole number of seconds, got '$RESERVE_S'"
[[ $ELBO_SEQUENCES =~ ^[1-9][0-9]*$ ]] || die "ELBO_SEQUENCES must be a positive whole number, got '$ELBO_SEQUENCES'"
if [ -n "${TRAIN_SECONDS:-}" ] && ! [[ $TRAIN_SECONDS =~ ^[1-9][0-9]*$ ]]; then
    die "TRAIN_SECONDS must be a positive whole number of seconds, got '$TRAIN_SECONDS'"
fi
read -r -a KINDS <<<"$NETWORKS"
((${#KINDS[@]})) || die "NETWORKS names no network"
for name in "${KINDS[@]}"; do
    [ -n "${NETWORK[$name]:-}" ] || die "NETWORKS: unknown network '$name' (expected some of ${!NETWORK[*]})"
done
for file in books.txt wiki.txt; do
    [ -f "$DATA_DIR/$file" ] || die "no $DATA_DIR/$file (copy text8-mini's $file there, or set DATA_DIR)"
done
case $DEVICE in cuda | cpu | auto) ;; *) die "DEVICE must be cuda, cpu or auto, got '$DEVICE'" ;; esac
if ((!PLAN)) && [ "$DEVICE" = cuda ] && ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
then
    die "no CUDA device (DEVICE=cpu trains these networks on the CPU)"
fi
CORPUS=$RUNS/corpus.txt
WIKI=$DATA_DIR/wiki.txt
BUNDLED=$ROOT/ddpd/pretrained/text8  # the bundled pair, scored beside the new networks
has() { [[ " ${KINDS[*]} " == *" $1 "* ]]; }

# resuming_all: whether every network continues a checkpoint
resuming_all() {
    local name
    for name in "${KINDS[@]}"; do
        [ -f "$RUNS/$name/train_state.json" ] || return 1
    done
}

# train_seconds ELAPSED: --max-time of new runs, what the budget leaves after ELAPSED seconds
train_seconds() {
    if [ -n "${TRAIN_SECONDS:-}" ]; then
        echo "$TRAIN_SECONDS"
    else
        echo $((BUDGET_S - $1 - RESERVE_S))
    fi
}

# train_deadline ELAPSED SECONDS: seconds from the training stage's start, ELAPSED seconds in,
# after which it stops late runs: 2/3 of the reserve after their --max-time SECONDS (their
# start, evaluations and checkpoints are outside it), and never later than a third of the
# reserve before the budget's end, kept for stages 4-6
train_deadline() {
    local late=$(($2 + RESERVE_S * 2 / 3)) last=$((BUDGET_S - $1 - RESERVE_S / 3))
    echo $((late < last ? late : last))
}

# train_command NAME SECONDS: the ddpd-train command line of one network
train_command() {
    local name=$1 args
    if [ -f "$RUNS/$name/train_state.json" ]; then  # a resumed run keeps its settings
        args="$name --resume"
    else
        # shellcheck disable=SC2086  # NETWORK and TRAIN_ARGS hold one argument per word
        args="${NETWORK[$name]} $TRAIN_ARGS --data $CORPUS --steps $STEPS --max-time $2 --warmup 200"
        args="$args --eval-every 500 --save-every 1000 --seed 0"
    fi
    echo "$PY -m ddpd.cli.train $args --out $RUNS/$name --device $DEVICE --no-progress"
}

# stage NAME LIMIT CMD...: run CMD (a function or a command) with STAGE_END set LIMIT seconds
# ahead (at most the end of the budget), for `limited`; report its outcome and time.
stage() {
    local name=$1 limit=$2 left=$((BUDGET_S - SECONDS)) start=$SECONDS rc=0
    shift 2
    ((limit > left)) && limit=$left
    if ((limit < 5)); then
        echo "## $name: SKIPPED, the budget is spent"
        return 1
    fi
    echo "## $name (limit $limit s, at $SECONDS s)"
    STAGE_END=$((SECONDS + limit))
    "$@" || rc=$?
    case $rc in
        0) echo "## $name: done in $((SECONDS - start)) s" ;;
        124 | 137) echo "## $name: STOPPED at its time limit after $((SECONDS - start)) s" ;;
        *) echo "## $name: FAILED (exit $rc) after $((SECONDS - start)) s" ;;
    esac
    return $rc
}

# limited CMD...: CMD under `timeout` until the stage's end (SIGTERM, then SIGKILL 20 s later)
limited() {
    local left=$((STAGE_END - SECONDS))
    ((left > 0)) || return 124
    timeout --kill-after=20 "$left" "$@"
}

build() {
    # what builds and runs ddpd here (an image's setuptools older than 77 refuses the build)
    $PY -c "import sys, torch, setuptools; print(f'python {sys.version.split()[0]}, torch {torch.__version__}, '
            f'setuptools {setuptools.__version__}, CUDA available: {torch.cuda.is_available()}')"
    local cuda=()
    # on a GPU the CUDA kernels, else the ops run their torch references there
    [ "$DEVICE" != cpu ] && $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" &&
        cuda=(--cuda)
    if (cd / && $PY -c "import ddpd.kernels, ddpd._C" 2>/dev/null); then
        echo "ddpd is installed: $(cd / && $PY -c 'import ddpd, os; print(os.path.dirname(ddpd.__file__))')"
    else
        pip_install "${#cuda[@]}" || return
    fi
    # setup.py leaves a failed compile to the first use: have it here, not inside training
    (cd / && limited $PY -m ddpd.ops ${cuda[@]+"${cuda[@]}"})
}

# pip_install GPU: pip install -e . (no downloads); GPU 1: ddpd._C's CUDA kernels for this GPU
pip_install() {
    use_carried_setuptools "$PY"
    if (($1)); then
        # this GPU's architecture only: a quarter of the compile time of the default list
        TORCH_CUDA_ARCH_LIST=$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
        export TORCH_CUDA_ARCH_LIST MAX_JOBS=${MAX_JOBS:-$(nproc)}
    fi
    limited $PY -m pip install -q --no-deps --no-build-isolation --no-index -e .
}

# What a training step of the first network runs: its device, dtype and attention kernel.
attention_check() {
    limited $PY - "${NETWORK[${KINDS[0]}]}" "$DEVICE" <<'PY'
import sys
import torch
from ddpd.cli.common import resolve_device
from ddpd.models import build_model, config_for, record_attention
args, device = sys.argv[1].split(), resolve_device(sys.argv[2])
kind, size = args[0], dict(zip(args[1::2], args[2::2]))
config = config_for(kind, 27, 256, d_model=int(size["--d-model"]), n_layers=int(size["--n-layers"]),
                    n_heads=int(size["--n-heads"]))
model = build_model(kind, config).to(device)
x = torch.randint(0, 27, (2, 256), device=device)
t = torch.rand(2, device=device)
autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")  # as ddpd.training
with autocast, record_attention() as calls:
    out = model(x) if kind in ("planner", "ar") else model(x, t)
out.float().sum().backward()
name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
print(f"attention check: {kind} on {name}, torch {torch.__version__}, activations {out.dtype}, "
      f"attention kernels {dict(calls)}")
PY
}

# Every network, tiny, 2 steps on $DEVICE (bf16, the validation pass, a save), then an ELBO of
# the tiny pair: the paths only a GPU runs fail here, in seconds, not in the training stage.
training_check() {
    local dir=$RUNS/check name pids=() failed=0 pid
    rm -rf "$dir" && mkdir -p "$dir"
    for name in "${KINDS[@]}"; do  # the kind, the first word of its arguments
        limited $PY -m ddpd.cli.train "${NETWORK[$name]%% *}" --d-model 32 --n-layers 1 \
            --n-heads 2 --batch-size 8 --data "$CORPUS" --steps 2 --warmup 1 --eval-every 1 --eval-batches 1 \
            --save-every 2 --seed 0 --out "$dir/$name" --device "$DEVICE" --no-progress >"$dir/$name.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    if ((failed)); then
        tail -n 20 "$dir"/*.log
        return 1
    fi
    has planner && has mask-denoiser || return 0
    limited $PY -m ddpd.cli.eval elbo --planner "$dir/planner" --denoiser "$dir/mask-denoiser" --data "$WIKI" \
        --split test --num-sequences 4 --mc-samples 1 --batch-size 4 --seed 0 --device "$DEVICE" --no-progress \
        --out "$dir/elbo.json" >"$dir/elbo.log" 2>&1 || { tail -n 20 "$dir/elbo.log"; return 1; }
    echo "training check: ${KINDS[*]} trained 2 steps, evaluated and saved on $DEVICE; the tiny pair's ELBO ran"
}

corpus() {
    mkdir -p "$RUNS"
    # text8 files are one line; a final line break, if any, is not part of the text
    { tr -d '\n' <"$DATA_DIR/books.txt"; printf ' '; tr -d '\n' <"$WIKI"; } >"$CORPUS.tmp" &&
        mv "$CORPUS.tmp" "$CORPUS" && echo "corpus: $(wc -c <"$CORPUS") characters in $CORPUS"
}

train() {
    local seconds=$1 deadline=$2 pids=() name failed=0 rc
    for name in "${KINDS[@]}"; do
        # shellcheck disable=SC2046  # the command is one argument per word
        timeout --kill-after=30 "$deadline" $(train_command "$name" "$seconds") >"$RUNS/train-$name.log" 2>&1 &
        pids+=($!)
    done
    for name in "${KINDS[@]}"; do
        wait "${pids[0]}"
        rc=$?
        pids=("${pids[@]:1}")
        case $rc in
            0) ;;
            124 | 137)
                INCOMPLETE+=("$name")
                echo "gpu_train: $name ran past the stage's deadline and was stopped (checkpoint in $RUNS/$name)" ;;
            *) echo "gpu_train: $name FAILED (exit $rc), see train-$name.log"; failed=1 ;;
        esac
        tail -n 3 "$RUNS/train-$name.log"
    done
    return $failed
}

# float16 copies of the weights and configs, what the bundle ships and every evaluation scores
export_float16() {
    limited $PY - "$RUNS" "${KINDS[@]}" <<'PY'
import os, sys
from ddpd.checkpoint import load_model, save_checkpoint
runs, kinds = sys.argv[1], sys.argv[2:]
for kind in kinds:
    model, config = load_model(os.path.join(runs, kind))
    out = os.path.join(runs, "float16", kind)
    save_checkpoint(out, model.half(), {k: v for k, v in config.items() if k != "sha256"})
    print(f"wrote {out}")
PY
}

# elbo NAME DATA MODEL ARGS...: one ELBO table in $RESULTS/NAME.json and .md, the tool's
# output in $RUNS/NAME.log
elbo() {
    local name=$1 data=$2
    shift 2
    limited $PY -m ddpd.cli.eval elbo "$@" --data "$data" --split test --num-sequences "$ELBO_SEQUENCES" \
        --mc-samples 4 --batch-size 64 --seed 0 --device "$DEVICE" --no-progress --out "$RESULTS/$name.json" \
        >"$RUNS/$name.log" 2>&1
}

evaluate() {
    local r=$RUNS/float16 new=() denoisers=() pids=() failed=0 pid name
    has planner && new+=(--planner "$r/planner")
    has mask-denoiser && denoisers+=("$r/mask-denoiser")
    has uniform-denoiser && denoisers+=("$r/uniform-denoiser")
    ((${#denoisers[@]})) && new+=(--denoiser "${denoisers[@]}")
    has uniform && new+=(--uniform "$r/uniform")
    local runs=()
    if ((${#new[@]})); then  # wiki.txt's first: the table that compares with the bundled pair
        elbo elbo-wiki "$WIKI" "${new[@]}" &
        pids+=($!)
        elbo elbo-wiki-bundled "$WIKI" --planner "$BUNDLED/planner" --denoiser "$BUNDLED/denoiser" &
        pids+=($!)
        elbo elbo-corpus "$CORPUS" "${new[@]}" &
        pids+=($!)
        runs+=(elbo-wiki elbo-wiki-bundled elbo-corpus)
    fi
    if has planner && has mask-denoiser; then  # the new networks as a bundle, and what it prints by default
        local uniform=()
        has uniform && uniform=(--uniform "$r/uniform")
        limited $PY -m ddpd.pretrained "$r/planner" "$r/mask-denoiser" ${uniform[@]+"${uniform[@]}"} \
            --dest "$RUNS/bundle" --dtype float16 &&
            limited env DDPD_PRETRAINED_DIR="$RUNS/bundle" $PY -m ddpd.cli.sample --fused --seed 0 \
                --device "$DEVICE" --no-progress ${SAMPLE_ARGS[@]+"${SAMPLE_ARGS[@]}"} \
                --out "$RESULTS/samples.jsonl" || failed=1
        if has uniform; then
            limited env DDPD_PRETRAINED_DIR="$RUNS/bundle" $PY -m ddpd.cli.sample --model uniform --fused --seed 0 \
                --device "$DEVICE" --no-progress ${SAMPLE_ARGS[@]+"${SAMPLE_ARGS[@]}"} \
                --out "$RESULTS/samples-uniform.jsonl" || failed=1
        fi
    fi
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    for name in "${runs[@]}"; do
        echo "### $name"
        cat "$RUNS/$name.log"
    done
    return $failed
}

plan() {
    local seconds
    seconds=$(train_seconds "$1")
    local rev
    rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    # a copy of a working tree can carry an older .git: say when the files are not that commit's
    [[ $rev != unknown ]] && ! git diff --quiet HEAD -- 2>/dev/null && rev="$rev, with files that differ from it"
    echo "# ddpd text8 GPU training, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $rev"
    echo "# budget $BUDGET_S s, reserve $RESERVE_S s, networks ${KINDS[*]}; training $seconds s a network (new"
    echo "# runs; this plan assumes $1 s before training, the run counts the time it took)"
    echo "# training stopped $(train_deadline "$1" "$seconds") s after its start at the latest"
    echo "# corpus $DATA_DIR/books.txt + $WIKI -> $CORPUS; runs $RUNS; results $RESULTS"
    local name
    for name in "${KINDS[@]}"; do
        echo "train $name: $(train_command "$name" "$seconds")"
    done
}

main() {
    local rc=0 seconds deadline name kept=()
    plan 60
    stage build 150 build || { echo "gpu_train: the build failed"; return 1; }
    stage "attention check" 60 attention_check || rc=1
    stage corpus 30 corpus || return 1
    stage "training check" 60 training_check || { echo "gpu_train: the training check failed"; return 1; }
    seconds=$(train_seconds "$SECONDS")
    deadline=$(train_deadline "$SECONDS" "$seconds")
    if ! resuming_all; then  # a resumed run's --max-time is its checkpoint's; the deadline still holds
        ((seconds > 0 && deadline > 0)) ||
            { echo "gpu_train: no time left to train (TRAIN_SECONDS=$seconds)"; return 1; }
        echo "training: --max-time $seconds s for new runs, stopped at $deadline s from now at the latest"
    else
        ((deadline > 30)) || { echo "gpu_train: no time left to continue the runs ($deadline s)"; return 1; }
        echo "training: continuing ${KINDS[*]}, stopped at $deadline s from now at the latest"
    fi
    stage train $((deadline + 40)) train "$seconds" "$deadline" || rc=1
    cp "$RUNS"/train-*.log "$RESULTS"/
    for name in "${KINDS[@]}"; do  # a network that left no checkpoint must not cost the others theirs
        if [ -f "$RUNS/$name/config.json" ]; then kept+=("$name"); else echo "gpu_train: no checkpoint of $name"; fi
    done
    ((${#kept[@]})) || { echo "gpu_train: no network left a checkpoint: nothing to evaluate"; return 1; }
    ((${#kept[@]} == ${#KINDS[@]})) || rc=1
    KINDS=("${kept[@]}")
    stage "training table" 60 limited $PY -m ddpd.cli.eval training "${KINDS[@]/#/$RUNS/}" --out-dir "$RESULTS" || rc=1
    [ -f "$RESULTS/training.md" ] && printf '\n%s\n' "The ${#KINDS[@]} networks trained at once on one $DEVICE \
device: tokens/s is each one's while sharing it. A run the deadline stopped (exit status 3) shows its last \
--eval-every validation, not a final one." >>"$RESULTS/training.md"
    stage export 60 export_float16 || return 1
    pack_float16  # handed back now: a call cut short keeps the weights
    stage eval $((BUDGET_S - SECONDS - 15)) evaluate || rc=1
    du -b "$RUNS"/float16/*/model.safetensors
    echo "# total $SECONDS s"
    if ((${#INCOMPLETE[@]})); then  # evaluated as they are; a rerun continues them (exit status 3)
        echo "gpu_train: ${INCOMPLETE[*]} stopped before --max-time; the same command again on this machine" \
            "continues them with --resume (their checkpoints in $RUNS, which a fresh device machine lacks)"
        ((rc)) || rc=3
    fi
    return $rc
}

# handed_back: whether $OUT is a folder, as on the device machine (what is under it comes back)
handed_back() { [ -n "${OUT:-}" ] && [ -d "$OUT" ]; }

# pack_float16: the float16 copies under $OUT, in parts of 15 MiB
pack_float16() {
    handed_back || return 0
    local bytes
    bytes=$(du -cb "$RUNS"/float16/*/model.safetensors 2>/dev/null | tail -n 1 | cut -f1)
    if ((${bytes:-0} > 0 && bytes < 60 * 1024 * 1024)); then
        tar -cf - -C "$RUNS" float16 | split -b 15m - "$OUT/float16.tar.part-"
    else
        echo "gpu_train: float16 copies not packed (${bytes:-0} bytes; a call returns 64 MiB at most)"
    fi
}

# pack: the rest of what a GPU run hands back, under $OUT (the log is written there as it goes)
pack() {
    handed_back || return 0
    tar -cf "$OUT/results.tar" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
    ls -l "$OUT"
}

if [ -z "${RESULTS:-}" ]; then
    device=cpu
    if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        device=$($PY -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()))")
    fi
    RESULTS=$ROOT/docs/text8/logs/train-${device%-}-$(date -u +%Y-%m-%d)
    n=2
    base=$RESULTS
    while [ -e "$RESULTS" ]; do  # never write over an earlier run's logs
        RESULTS=$base-$n
        n=$((n + 1))
    done
fi
if ((PLAN)); then
    plan 60
    exit 0
fi
[ "$SMOKE" = 1 ] && [ -z "${KEEP_SMOKE:-}" ] && [[ $RUNS == "$SMOKE_DIR"/* ]] && rm -rf "$SMOKE_DIR"
mkdir -p "$RESULTS" "$RUNS"
logs=("$RESULTS/gpu_train.log")
handed_back && logs+=("$OUT/gpu_train.log")  # as it goes: a call cut short still returns it
main 2>&1 | tee "${logs[@]}"
status=${PIPESTATUS[0]}
pack
echo "gpu_train: results in $RESULTS (exit $status)"
exit "$status"
