#!/usr/bin/env bash
# GPU check for a carried release binary (the device has no Rust toolchain; nothing is built here):
#   1. kernel self-test (every kernel vs a host reference, batch invariance by bit equality);
#   2. CPU-vs-CUDA parity with `kiln score --ref-logits` on synthesized models;
#   3. a `kiln bench` table, CUDA and CPU.
# Build on a machine with Rust: cargo build --release -p kiln-cli --features cuda
# Run on the GPU machine from the repository root: tools/device-check.sh [path/to/kiln]
# Logs go to $OUT (default /tmp/kiln-device-check); the bench table is printed last. Stops at the first failure.
set -uo pipefail

KILN=${1:-${KILN:-target/release/kiln}}
OUT=${OUT:-/tmp/kiln-device-check}
WORK=${WORK:-$(mktemp -d)}
CHUNKS=${CHUNKS:-4}
CTX=${CTX:-256}
mkdir -p "$OUT"
export XDG_CACHE_HOME="$WORK/cache" # a fresh kernel cache: the first self-test compiles, the second loads

say() { echo "== $*" | tee -a "$OUT/summary.txt"; }
# step NAME CMD...: runs CMD with its output in $OUT/NAME.log; stops the script when it fails.
step() {
    local name=$1
    shift
    say "$name: $*"
    local t0=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then
        say "FAILED: $name (exit $rc, $((SECONDS - t0)) s); last lines of $name.log:"
        tail -n 30 "$OUT/$name.log" | tee -a "$OUT/summary.txt"
        exit 1
    fi
    say "ok: $name ($((SECONDS - t0)) s)"
}

[ -x "$KILN" ] || { say "no kiln binary at $KILN (build with --features cuda and carry it)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"

# 1. Kernels (the first run compiles them with NVRTC; the second must hit the disk cache).
step selftest "$KILN" selftest --device cuda
grep -E "^(ok|FAIL|device|all)" "$OUT/selftest.log" | tee -a "$OUT/summary.txt"
step selftest-cached "$KILN" selftest --device cuda
grep -E "^device" "$OUT/selftest-cached.log" | tee -a "$OUT/summary.txt"

# 2. Parity. Text: this repository's prose, the same bytes on both devices.
cat README.md docs/*.md crates/*/src/lib.rs 2>/dev/null | head -c 60000 >"$WORK/text.txt"
parity() {
    local tag=$1 arch=$2 preset=$3 quant=$4
    local m="$WORK/$tag.gguf"
    step "synth-$tag" "$KILN" synth --arch "$arch" --preset "$preset" --quant "$quant" -o "$m"
    step "score-cpu-$tag" "$KILN" score -m "$m" -f "$WORK/text.txt" -c "$CTX" --chunks "$CHUNKS" \
        --dump-logits "$WORK/ref-$tag"
    step "score-cuda-$tag" "$KILN" score -m "$m" -f "$WORK/text.txt" -c "$CTX" --chunks "$CHUNKS" \
        --device cuda --ref-logits "$WORK/ref-$tag"
    tail -n 12 "$OUT/score-cuda-$tag.log" | tee -a "$OUT/summary.txt"
}
parity llama-q4_1 llama smollm2-135m q4_1
parity llama-q4_k_m llama smollm2-135m q4_k_m
parity qwen3-q8_0 qwen3 0.6b q8_0

# 3. Speed (the simple kernels of this stage; see docs for what is left).
step bench-cuda "$KILN" bench -m "$WORK/llama-q4_1.gguf" -m "$WORK/qwen3-q8_0.gguf" --device cuda -p 64 -n 32 -r 2
step bench-cpu "$KILN" bench -m "$WORK/llama-q4_1.gguf" -m "$WORK/qwen3-q8_0.gguf" -p 64 -n 32 -r 2
say "bench (CUDA, then CPU):"
grep -E "^\|" "$OUT/bench-cuda.log" | tee -a "$OUT/summary.txt"
grep -E "^\|" "$OUT/bench-cpu.log" | tee -a "$OUT/summary.txt"
