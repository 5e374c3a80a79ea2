#!/usr/bin/env bash
# Reproduces docs/text8/: the text8 models of ddpd and every evaluation of them.
#
#   docs/text8/reproduce.sh train    # five networks on $DATA, all at once
#   docs/text8/reproduce.sh export   # their weights as float16, without training state
#   docs/text8/reproduce.sh eval     # ELBO, denoising, sample-quality sweep, convergence
#                                    # (of the float16 copies, each in a process of its own)
#   docs/text8/reproduce.sh bundle   # the default bundle: float16 planner + mask denoiser + uniform model
#   docs/text8/reproduce.sh all      # the four in turn
#
# Run from anywhere with ddpd installed (`pip install -e .`). The networks train as
# concurrent processes (on one GPU they share it; on a CPU give each a thread with
# OMP_NUM_THREADS=1). Every tool is the package's own: ddpd-train, ddpd-eval,
# python -m ddpd.pretrained, ddpd-sample. Settings, from the environment:
#   DATA           text8-format corpus: a file, or a corpus name of ddpd-train --data
#                  (default text8: the full text8, downloaded once through `datasets`,
#                  pip install "ddpd[hf]"). docs/text8 was made with DATA=.../wiki.txt,
#                  text8-mini/wiki.txt (see docs/text8/README.md)
#   RUNS           checkpoints and logs (default runs/text8); the float16 copies go to
#                  $RUNS/float16, which is what eval and bundle read
#   RESULTS        tables and plots (default docs/text8)
#   BUNDLE         where `bundle` writes (default $RUNS/bundle; ddpd/pretrained/text8
#                  replaces the bundle shipped in the package, keeping the previous one)
#   TRAIN_SECONDS  training seconds per network (ddpd-train --max-time; default 180)
#   STEPS          step ceiling per network (default 20000: the clock ends the runs)
#   SAMPLES        samples per sweep configuration (default 64)
#   SWEEP_STEPS    step budgets of the sweep (default "64 128 256 512")
#   TEMPERATURES   denoiser temperatures of the sweep (default "0.8 0.9 1.0")
#   QUALITY_ARGS   more ddpd-eval quality arguments for the sweep (QUALITY_ARGS=--fused: the
#                  same samplers on their fused paths, fewer launches a step on a GPU)
#   TRAIN_ARGS     more ddpd-train arguments for every network, after the recipe's
#                  (a later one wins: TRAIN_ARGS="--d-model 32 --n-layers 1" for a smoke run)
#   DEVICE         auto (default), cpu or cuda
#   PYTHON         the interpreter (default python3)
# The learning-rate decay of each run ends at TRAIN_SECONDS, so how many steps a run
# takes depends on the machine; every evaluation is reproducible from its seed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DATA=${DATA:-text8}
RUNS=${RUNS:-$ROOT/runs/text8}
RESULTS=${RESULTS:-$ROOT/docs/text8}
BUNDLE=${BUNDLE:-$RUNS/bundle}
TRAIN_SECONDS=${TRAIN_SECONDS:-180}
STEPS=${STEPS:-20000}
SAMPLES=${SAMPLES:-64}
SWEEP_STEPS=${SWEEP_STEPS:-64 128 256 512}
TEMPERATURES=${TEMPERATURES:-0.8 0.9 1.0}
QUALITY_ARGS=${QUALITY_ARGS:-}
TRAIN_ARGS=${TRAIN_ARGS:-}
DEVICE=${DEVICE:-auto}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

# name: ddpd-train arguments. The four diffusion networks share one size (the bundle
# of planner + mask denoiser + uniform model then fits in 45 MB as float16); the autoregressive judge
# is larger, with dropout against the few epochs' overfitting of a 2.8M-character corpus.
declare -A NETWORK=(
    [planner]="planner --d-model 256 --n-layers 4 --n-heads 4 --batch-size 128 --lr 1e-3"
    [mask-denoiser]="mask-denoiser --d-model 256 --n-layers 4 --n-heads 4 --batch-size 128 --lr 1e-3"
    [uniform-denoiser]="uniform-denoiser --d-model 256 --n-layers 4 --n-heads 4 --batch-size 128 --lr 1e-3"
    [uniform]="uniform --d-model 256 --n-layers 4 --n-heads 4 --batch-size 128 --lr 1e-3"
    [ar]="ar --d-model 384 --n-layers 4 --n-heads 6 --dropout 0.2 --batch-size 64 --lr 1e-3"
)
ORDER=(planner mask-denoiser uniform-denoiser uniform ar)

# jobs NAME CMD... (backgrounded by the caller) and wait_all: run several commands at
# once, each logging to $RUNS/NAME.log, and report every failure.
job() {
    local name=$1
    shift
    "$@" >"$RUNS/$name.log" 2>&1
    local rc=$?
    ((rc)) && echo "reproduce: $name FAILED (exit $rc), see $RUNS/$name.log" >&2
    return $rc
}

wait_all() {
    local failed=0 pid
    for pid in "$@"; do
        wait "$pid" || failed=1
    done
    return $failed
}

train() {
    case "$DATA" in
        text8 | books | hf:*) ;;
        *) [ -f "$DATA" ] || { echo "reproduce: DATA: no such file: $DATA" >&2; return 1; } ;;
    esac
    mkdir -p "$RUNS"
    local pids=() name resume
    for name in "${ORDER[@]}"; do
        resume=()
        [ -f "$RUNS/$name/train_state.json" ] && resume=(--resume)
        # shellcheck disable=SC2086  # NETWORK and TRAIN_ARGS hold one argument per word
        job "train-$name" $PY -m ddpd.cli.train ${NETWORK[$name]} $TRAIN_ARGS --data "$DATA" --out "$RUNS/$name" \
            --steps "$STEPS" --max-time "$TRAIN_SECONDS" --warmup 100 --eval-every 250 --save-every 500 \
            --seed 0 --device "$DEVICE" --no-progress "${resume[@]}" &
        pids+=($!)
    done
    echo "reproduce: training ${ORDER[*]} for ${TRAIN_SECONDS} s each, logs in $RUNS/train-*.log"
    wait_all "${pids[@]}"
    local rc=$?
    tail -n 2 "$RUNS"/train-*.log
    mkdir -p "$RESULTS"
    $PY -m ddpd.cli.eval training "${ORDER[@]/#/$RUNS/}" --out-dir "$RESULTS" || rc=1
    return $rc
}

# The sample-quality sweep runs as eight processes, each over a group of samplers
# (sampling is launch-bound at this size: the processes share one GPU well), and
# ddpd-eval merge joins their tables.
SWEEP_GROUPS=(
    "ddpd-A-mask ddpd-AB-mask" "ddpd-ABC-mask tau-planned-mask"
    "ddpd-A-uniform ddpd-AB-uniform" "ddpd-ABC-uniform tau-planned-uniform"
    "ddpd-A-uniform-model ddpd-AB-uniform-model" "ddpd-ABC-uniform-model dfm-uni"
    "dfm-eta0 dfm-eta15" "maskgit"
)

# float16 copies of the weights (and configs), the precision the bundle ships in, so that
# every evaluation scores the weights users get.
export_float16() {
    $PY - "$RUNS" "${ORDER[@]}" <<'PY'
import os, sys
from ddpd.checkpoint import load_model, save_checkpoint
runs, kinds = sys.argv[1], sys.argv[2:]
for kind in kinds:
    model, config = load_model(os.path.join(runs, kind))
    save_checkpoint(os.path.join(runs, "float16", kind), model.half(), {k: v for k, v in config.items() if k != "sha256"})
    print(f"wrote {os.path.join(runs, 'float16', kind)}")
PY
}

evaluate() {
    local r=$RUNS/float16 models pids=() i parts=()
    [ -d "$r" ] || { echo "reproduce: no float16 copies in $r: run export first" >&2; return 1; }
    mkdir -p "$RESULTS"
    models=(--planner "$r/planner" --denoiser "$r/mask-denoiser" "$r/uniform-denoiser" --uniform "$r/uniform")
    job elbo $PY -m ddpd.cli.eval elbo "${models[@]}" --data "$DATA" --split test --num-sequences 256 \
        --mc-samples 4 --batch-size 64 --seed 0 --device "$DEVICE" --no-progress --out "$RESULTS/elbo.json" &
    pids+=($!)
    for i in "${!SWEEP_GROUPS[@]}"; do
        # shellcheck disable=SC2086  # one sampler name, budget, temperature or argument per word
        job "quality-$i" $PY -m ddpd.cli.eval quality "${models[@]}" --judge "$r/ar" --data "$DATA" --split test \
            --samplers ${SWEEP_GROUPS[$i]} --steps $SWEEP_STEPS --temperatures $TEMPERATURES \
            --num-samples "$SAMPLES" --batch-size "$SAMPLES" --reference-sequences 256 --seed 0 \
            --device "$DEVICE" --no-progress --out-dir "$RUNS/quality-$i" $QUALITY_ARGS &
        pids+=($!)
        parts+=("$RUNS/quality-$i/sweep.csv")
    done
    for i in mask uniform; do
        job "convergence-$i" $PY -m ddpd.cli.eval convergence --planner "$r/planner" --denoiser "$r/$i-denoiser" \
            --steps 512 --num-samples "$SAMPLES" --batch-size "$SAMPLES" --seed 0 --device "$DEVICE" \
            --no-progress --out-dir "$RESULTS/convergence-$i" &
        pids+=($!)
    done
    wait_all "${pids[@]}"
    local rc=$?
    $PY -m ddpd.cli.eval merge "${parts[@]}" --out-dir "$RESULTS/quality" >/dev/null || rc=1
    return $rc
}

bundle() {
    local uniform=()
    [[ -d $RUNS/float16/uniform ]] && uniform=(--uniform "$RUNS/float16/uniform")
    $PY -m ddpd.pretrained "$RUNS/float16/planner" "$RUNS/float16/mask-denoiser" ${uniform[@]+"${uniform[@]}"} \
        --dest "$BUNDLE" --dtype float16 || return 1
    mkdir -p "$RESULTS"
    # what the bundle prints with no other argument than its location
    DDPD_PRETRAINED_DIR=$BUNDLE $PY -m ddpd.cli.sample --seed 0 --device "$DEVICE" --out "$RESULTS/samples.jsonl"
}

case "${1:-}" in
    train) train ;;
    export) export_float16 ;;
    eval) evaluate ;;
    bundle) bundle ;;
    all) train && export_float16 && evaluate && bundle ;;
    *) echo "usage: $0 train|export|eval|bundle|all" >&2; exit 2 ;;
esac
