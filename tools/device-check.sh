#!/usr/bin/env bash
# GPU check for a carried release binary (the device has no Rust toolchain; nothing is built here):
#   1. kernel self-test (every kernel vs a host reference, batch invariance and graph replay by bit equality),
#      then under compute-sanitizer (memcheck, racecheck, synccheck) when it is installed;
#   2. parity with `kiln score --ref-logits` on synthesized models: CUDA vs the CPU in the reference mode
#      (KILN_NO_QUANT_ACT=1 on both) and in the default fast mode; graph replay vs no graph (identical logits);
#   3. the bench table: synth Qwen3-8B Q4_K_M / Q8_0 and a 0.6B-shape Q4_K_M with the real Qwen3 tokenizer,
#      tg128, a 16-row block through the decode path (pp16 -b 16), prefill pp512/pp4096 in chunks of 512, and the
#      kill-switch A/B of each optimization.
# Build on a machine with Rust: cargo build --release -p kiln-cli --features cuda (strip its debug info to copy it over).
# Run on the GPU machine from the repository root: tools/device-check.sh [path/to/kiln]
# Sections: STEPS="selftest sanitizer kernels parity bench prefill frontier serve moe dflash profile" (default all;
# validate = a new build's self-test and memcheck while the bench's models are synthesized, not in the default;
# quick = when GPU time is short (~6 minutes, not in the default): configuration 1's self-test, the newest
# switches' A/Bs (L2 prefetch: tg128 and the 16-row block; the prep of several rows in the split kernel) and the
# DFlash forced-acceptance table;
# kernels = per-kernel timings; prefill = the prefill matmuls on cuBLAS against the int8 kernels, by pass size;
# frontier = prefill to 2k/8k/32k and its logits against the int8 kernels' and the decode path's; serve = kiln serve
# under concurrent load against each request alone;
# bits = logits bit-equal to another build's, REF_KILN=path, not in the default;
# moe = a synth Qwen3-30B-A3B Q4_K_M's decode, 16-row block and prefill;
# dflash = greedy output with a drafter equal to plain decoding on a tiny target (a drafter on the GPU, and one with a
# sliding-window layer on the CPU), then a random drafter of z-lab's Qwen3-8B shape (5 layers, Q8_0) on the 8B Q4_K_M
# target, forced τ 4/7/10, its matmuls and then its head (the target's Q6_K) off cuBLAS, and the same drafter as
# bf16 safetensors (z-lab's format) with its BF16 matmuls on cuBLAS and off;
# profile = ncu's time of every kernel of a decode step and of a 16-row block, per step, and of the 8B's prefill
# chunks of 512 (PROFILE="decode block16 prefill moe-prefill dflash" picks shapes; moe-prefill, the 30B-A3B's,
# and dflash, a DFlash round's kernels, only when named);
# tune = kernel constants from TUNE tried against the defaults, not in the default;
# ablate = the 8B's decode step, then its 16-row block, without one kind of launch at a time, not in the default;
# block16 = the K8 block kernels by launch: ncu's time of one layer's four 16-row launches (8B and 0.6B Q4_K_M) on
# the direct kernel (the default), the 4-warp kernel by size (KILN_NO_CUDA_BLOCK_DIRECT) and its 32-output tiles
# alone, then pp16 -b 16 with and without the direct kernel and its weight ring, and with its tuning defines
# (B16_PACKED_SUMS=1, B16D_PREFETCH=1 without the ring; B16_AB picks others), not in the default;
# n8 = blocks of at most 8 rows on the direct kernel's one-tile form against the 16-row kernel, and DFlash at forced
# acceptance 3 and 6 verifying 7 drafts against 15, not in the default;
# stalls = ncu's warp states (stall reasons), occupancy, scheduler and memory sections for one layer's K8 block
# kernels at 16 rows and its one-row GEMVs, 8B Q4_K_M, not in the default). Logs go to $OUT (default
# /tmp/kiln-device-check); the bench table is printed last. Stops at the first failure.
set -uo pipefail

KILN=${1:-${KILN:-target/release/kiln}}
OUT=${OUT:-/tmp/kiln-device-check}
# Synthesized models stay in WORK between runs (a warm GPU machine keeps /tmp): one call per section fits the
# device's per-command limit, e.g. STEPS="selftest sanitizer kernels", then "parity", "bench", "dflash".
WORK=${WORK:-/tmp/kiln-device-work}
mkdir -p "$WORK"
CHUNKS=${CHUNKS:-4}
CTX=${CTX:-256}
STEPS=${STEPS:-selftest sanitizer kernels parity bench prefill frontier serve moe dflash profile}
TOKENIZER=${TOKENIZER:-.test-assets/tokenizer-qwen3/tokenizer.json}
mkdir -p "$OUT"
export XDG_CACHE_HOME="$WORK/cache-$$" # a fresh kernel cache: the first self-test compiles, the second loads

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
want() { [[ " $STEPS " == *" $1 "* ]]; }
# AB_SKIP="NAME ..." leaves out A/Bs already measured for this build (to fit a time-limited run): NAME is the
# switch of the bench and dflash sections' A/Bs, e.g. KILN_NO_CUDA_DRAFTER_BLAS, Q8D_MINB or bf16.
ab_want() { [[ " ${AB_SKIP:-} " != *" $1 "* ]]; }
# synth NAME FILE ARGS...: synthesizes FILE once (kept in WORK for later runs).
synth() {
    local name=$1 file=$2
    shift 2
    if [ -s "$file" ]; then
        say "reusing $file"
    else
        step "$name" "$KILN" synth "$@" -o "$file.tmp" && mv "$file.tmp" "$file"
    fi
}
# Pack the logs into one archive at exit (one file to copy off the GPU machine).
trap 'tar czf "$OUT/logs.tgz" -C "$OUT" --remove-files $(cd "$OUT" && ls *.log 2>/dev/null) 2>/dev/null' EXIT

[ -x "$KILN" ] || { say "no kiln binary at $KILN (build with --features cuda and copy it here)"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"
tok=()
[ -f "$TOKENIZER" ] && tok=(--tokenizer "$TOKENIZER")

# 0. A new build's first check (STEPS=validate, not in the default): the self-test (every configuration) and
# memcheck over configuration 1, while the models the bench and dflash sections use are synthesized on the CPUs.
if want validate; then
    (synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}" &&
        synth synth-draft-8b "$WORK/d8b-q8.gguf" --arch dflash --target "$WORK/q8b-q4km.gguf" --quant q8_0 &&
        synth synth-06b-q4km "$WORK/q06-q4km.gguf" --arch qwen3 --preset 0.6b --quant q4_k_m "${tok[@]}") &
    models=$!
    step selftest "$KILN" selftest --device cuda
    grep -E "^(FAIL|device|all)" "$OUT/selftest.log" | tee -a "$OUT/summary.txt"
    if command -v compute-sanitizer >/dev/null; then
        step sanitizer-memcheck timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$KILN" selftest \
            --device cuda --config 1
        grep -E "ERROR SUMMARY|all .* passed" "$OUT/sanitizer-memcheck.log" | tail -n 2 | tee -a "$OUT/summary.txt"
    fi
    wait "$models" || { say "FAILED: synthesizing the models"; exit 1; }
fi

# 0b. The short form (STEPS=quick): what to measure first with a few minutes of GPU time.
if want quick; then
    (synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}" &&
        synth synth-draft-8b "$WORK/d8b-q8.gguf" --arch dflash --target "$WORK/q8b-q4km.gguf" --quant q8_0 &&
        synth synth-06b-q4km "$WORK/q06-q4km.gguf" --arch qwen3 --preset 0.6b --quant q4_k_m "${tok[@]}") &
    models=$!
    step selftest-1 "$KILN" selftest --device cuda --config 1
    grep -E "^(FAIL|device|all)" "$OUT/selftest-1.log" | tee -a "$OUT/summary.txt"
    wait "$models" || { say "FAILED: synthesizing the models"; exit 1; }
    step quick-l2 timeout 150 "$KILN" bench -m "$WORK/q06-q4km.gguf" -m "$WORK/q8b-q4km.gguf" --device cuda \
        -p 16 -b 16 -n 128 -r 3 --ab KILN_NO_CUDA_L2_PREFETCH=1
    step quick-prep-rows timeout 90 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 16 -b 16 -n 0 -r 3 \
        --ab KILN_NO_CUDA_PREP_ROWS_IN_SPLIT=1
    step quick-dflash timeout 150 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda --draft "$WORK/d8b-q8.gguf" \
        --draft-force 3,6,9 --draft-max 7,15 -d 256 -n 128 -r 2
    say "quick (CUDA):"
    grep -hE "^\||ratio" "$OUT/quick-l2.log" "$OUT/quick-prep-rows.log" "$OUT/quick-dflash.log" |
        tee -a "$OUT/summary.txt"
fi

# 1. Kernels (the first run compiles them with NVRTC; the second must hit the disk cache).
if want selftest; then
    step selftest "$KILN" selftest --device cuda
    grep -E "^(FAIL|device|all)" "$OUT/selftest.log" | tee -a "$OUT/summary.txt"
    step selftest-cached "$KILN" selftest --device cuda
    grep -E "^device" "$OUT/selftest-cached.log" | tee -a "$OUT/summary.txt"
    # The K8 block kernels' tuning defines (off by default): code sums packed by the K8 writers on the direct
    # kernel (configuration 1; 6 without its weight ring) and the 4-warp one (configuration 5), and the direct
    # kernel's L2 prefetch (its register pipeline only, configuration 6). tag:configuration:defines.
    for v in packed:1:-DB16_PACKED_SUMS=1 packed-noring:6:-DB16_PACKED_SUMS=1 packed-4warp:5:-DB16_PACKED_SUMS=1 \
        prefetch:6:-DB16D_PREFETCH=1; do
        tag=${v%%:*} rest=${v#*:}
        step "selftest-b16-$tag" env KILN_CUDA_DEFINES="${rest#*:}" "$KILN" selftest --device cuda --config "${rest%%:*}"
        grep -E "^(FAIL|all)" "$OUT/selftest-b16-$tag.log" | tee -a "$OUT/summary.txt"
    done
fi
if want sanitizer && command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck synccheck; do
        # SAN_CONFIG=1,5 (say) keeps the pass to some of the self-test's configurations (kiln selftest --config).
        step "sanitizer-$tool" timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$KILN" selftest --device cuda \
            ${SAN_CONFIG:+--config "$SAN_CONFIG"}
        grep -E "ERROR SUMMARY|hazard|all .* passed" "$OUT/sanitizer-$tool.log" | tail -n 3 | tee -a "$OUT/summary.txt"
    done
    # The K8 block kernels on the writers' packed code sums (a tuning define, off by default).
    step sanitizer-memcheck-packed env KILN_CUDA_DEFINES=-DB16_PACKED_SUMS=1 timeout 300 compute-sanitizer \
        --tool memcheck --error-exitcode 9 "$KILN" selftest --device cuda --config 1,5,6
    grep -E "ERROR SUMMARY|all .* passed" "$OUT/sanitizer-memcheck-packed.log" | tail -n 2 | tee -a "$OUT/summary.txt"
fi

if want kernels; then
    step kernels "$KILN" selftest --device cuda --bench
    grep -E "^\|" "$OUT/kernels.log" | tee -a "$OUT/summary.txt"
fi

# 2. Parity. Text: this repository's prose, the same bytes on both devices.
cat README.md docs/*.md crates/*/src/lib.rs 2>/dev/null | head -c 60000 >"$WORK/text.txt"
parity() {
    local tag=$1 arch=$2 preset=$3 quant=$4
    local m="$WORK/$tag.gguf"
    local t=()
    # The real Qwen3 tokenizer for the real-size Qwen3 presets; llama and tiny presets carry their own vocabulary.
    [ "$arch" != llama ] && [ "$preset" != tiny ] && t=("${tok[@]}")
    synth "synth-$tag" "$m" --arch "$arch" --preset "$preset" --quant "$quant" "${t[@]}"
    local sc=(score -m "$m" -f "$WORK/text.txt" -c "$CTX" --chunks "$CHUNKS")
    step "score-cpu-ref-$tag" env KILN_NO_QUANT_ACT=1 "$KILN" "${sc[@]}" --dump-logits "$WORK/ref-$tag"
    step "score-cuda-ref-$tag" env KILN_NO_QUANT_ACT=1 "$KILN" "${sc[@]}" --device cuda --ref-logits "$WORK/ref-$tag"
    step "score-cpu-$tag" "$KILN" "${sc[@]}" --dump-logits "$WORK/fast-$tag"
    step "score-cuda-$tag" "$KILN" "${sc[@]}" --device cuda --ref-logits "$WORK/fast-$tag" \
        --dump-logits "$WORK/graph-$tag"
    step "score-cuda-nograph-$tag" env KILN_NO_CUDA_GRAPH=1 "$KILN" "${sc[@]}" --device cuda \
        --ref-logits "$WORK/graph-$tag"
    for run in cuda-ref cuda cuda-nograph; do
        say "parity $tag $run:"
        grep -iE "top-1|KL|max" "$OUT/score-$run-$tag.log" | head -n 6 | tee -a "$OUT/summary.txt"
    done
}
# PARITY="tag ..." runs a subset of the five. REAL_GGUF=path adds a real model (tag "real", e.g. SmolLM2-135M-Instruct
# Q4_1: 98 MB, so it may have to reach the GPU machine in parts, see tools/dflash-train/split-gguf.sh).
if want parity; then
    for spec in "qwen3moe-q8_0 qwen3moe tiny q8_0" "llama-q4_1 llama smollm2-135m q4_1" \
        "llama-q4_k_m llama smollm2-135m q4_k_m" "qwen3-q4_k_m qwen3 0.6b q4_k_m" "qwen3-q8_0 qwen3 0.6b q8_0"; do
        read -r tag arch preset quant <<<"$spec"
        [[ -z "${PARITY:-}" || " $PARITY " == *" $tag "* ]] && parity "$tag" "$arch" "$preset" "$quant"
    done
    if [ -n "${REAL_GGUF:-}" ]; then
        ln -sf "$(realpath "$REAL_GGUF")" "$WORK/real.gguf" # parity() finds it there and synthesizes nothing
        parity real llama real -
    fi
fi

# 2b. The same bits as another build (STEPS=bits, REF_KILN=path/to/the/other/kiln): for a change that keeps every
# bit by construction (a kernel rebuilt on the same integers and float order), synth Qwen3 0.6B Q4_K_M and Q8_0 are
# scored on CUDA by both binaries in passes of 64 rows (the prefill kernels), 16 rows (the block kernels) and one
# row (the decode path: prep in the split kernel, graphs), the 8B Q4_K_M in one-row passes, and the logits
# compared: KL 0 expected; then both builds' per-kernel timings and their decode speed, alternated.
if want bits; then
    [ -x "${REF_KILN:-}" ] || { say "bits: REF_KILN must name the other build's kiln binary"; exit 1; }
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    sc=(score -m "$WORK/q8b-q4km.gguf" -f "$WORK/text.txt" -c 256 --chunks 1 --device cuda -b 1)
    step bits-ref-8b-b1 "$REF_KILN" "${sc[@]}" --dump-logits "$WORK/bits-ref-8b-b1"
    step bits-8b-b1 "$KILN" "${sc[@]}" --ref-logits "$WORK/bits-ref-8b-b1"
    say "bits, 8B q4_k_m, one-row passes:"
    grep -iE "KL" "$OUT/bits-8b-b1.log" | head -n 2 | tee -a "$OUT/summary.txt"
    for quant in q4_k_m q8_0; do
        m="$WORK/qwen3-$quant.gguf"
        synth "synth-qwen3-$quant" "$m" --arch qwen3 --preset 0.6b --quant "$quant" "${tok[@]}"
        for b in 64 16 1; do
            sc=(score -m "$m" -f "$WORK/text.txt" -c "$CTX" --chunks "$CHUNKS" --device cuda -b "$b")
            step "bits-ref-$quant-b$b" "$REF_KILN" "${sc[@]}" --dump-logits "$WORK/bits-ref-$quant-b$b"
            step "bits-$quant-b$b" "$KILN" "${sc[@]}" --ref-logits "$WORK/bits-ref-$quant-b$b"
            say "bits, $quant, passes of $b rows:"
            grep -iE "KL" "$OUT/bits-$quant-b$b.log" | head -n 2 | tee -a "$OUT/summary.txt"
        done
    done
    # The per-kernel timings of both builds, one after the other on the same card.
    for who in ref this; do
        bin=$KILN
        [ "$who" = ref ] && bin=$REF_KILN
        step "bits-kernels-$who" "$bin" selftest --device cuda --bench
        say "kernel timings ($who build):"
        grep -E "^\| (gemv|mmq|attention|moe|in a graph)" "$OUT/bits-kernels-$who.log" | tee -a "$OUT/summary.txt"
    done
    synth synth-06b-q4km "$WORK/q06-q4km.gguf" --arch qwen3 --preset 0.6b --quant q4_k_m "${tok[@]}"
    for i in 1 2; do
        for who in ref this; do
            bin=$KILN
            [ "$who" = ref ] && bin=$REF_KILN
            step "bits-speed-$who-$i" "$bin" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda \
                -p 0 -n 128 -r 2
            say "decode speed ($who build, run $i):"
            grep -E "^\| qwen3" "$OUT/bits-speed-$who-$i.log" | tee -a "$OUT/summary.txt"
        done
    done
fi

# 3. Speed. Byte counts for the roofline: `kiln info` gives each model's size.
if want bench; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    synth synth-8b-q8 "$WORK/q8b-q8.gguf" --arch qwen3 --preset 8b --quant q8_0 "${tok[@]}"
    synth synth-06b-q4km "$WORK/q06-q4km.gguf" --arch qwen3 --preset 0.6b --quant q4_k_m "${tok[@]}"
    models=(-m "$WORK/q8b-q4km.gguf" -m "$WORK/q8b-q8.gguf" -m "$WORK/q06-q4km.gguf")
    step bench-tg "$KILN" bench "${models[@]}" --device cuda -p 0 -n 128 -r 3
    step bench-block16 "$KILN" bench "${models[@]}" --device cuda -p 16 -b 16 -n 0 -r 5
    step bench-pp "$KILN" bench "${models[@]}" --device cuda -p 512,4096 -b 512 -n 0 -r 2
    # Kill-switch A/B (interleaved, one process per run): graphs matter most on the launch-bound 0.6B.
    ab_want KILN_NO_CUDA_GRAPH && step ab-KILN_NO_CUDA_GRAPH "$KILN" bench -m "$WORK/q06-q4km.gguf" -m "$WORK/q8b-q4km.gguf" --device cuda \
        -p 0 -n 128 -r 2 --ab KILN_NO_CUDA_GRAPH=1
    # Attention: one-row passes (prep in the split kernel), rows of one split (finished there), and a KV head's
    # query heads over several blocks (short rows).
    for flag in KILN_NO_CUDA_PREP_IN_SPLIT KILN_NO_CUDA_SPLIT_DIRECT KILN_NO_CUDA_ATTN_HEAD_SPLIT; do
        ab_want "$flag" && step "ab-$flag" "$KILN" bench -m "$WORK/q06-q4km.gguf" -m "$WORK/q8b-q4km.gguf" \
            --device cuda -p 0 -n 128 -r 2 --ab "$flag=1"
    done
    # The split grid fitted to the longest span: short contexts in a large slot (what `kiln run -c 32768` pays at
    # its first tokens), a decode step and a 16-row block.
    ab_want KILN_NO_CUDA_ATTN_FIT_GRID && step ab-KILN_NO_CUDA_ATTN_FIT_GRID "$KILN" bench -m "$WORK/q06-q4km.gguf" \
        -m "$WORK/q8b-q4km.gguf" --device cuda -p 16 -b 16 -n 128 -c 32768 -r 2 --ab KILN_NO_CUDA_ATTN_FIT_GRID=1
    # A 16-row block's attention prep in attn_prep instead of inside the split kernel.
    ab_want KILN_NO_CUDA_PREP_ROWS_IN_SPLIT && step ab-KILN_NO_CUDA_PREP_ROWS_IN_SPLIT "$KILN" bench \
        -m "$WORK/q06-q4km.gguf" -m "$WORK/q8b-q4km.gguf" --device cuda -p 16 -b 16 -n 0 -r 3 \
        --ab KILN_NO_CUDA_PREP_ROWS_IN_SPLIT=1
    # One-row GEMVs prefetching the weights of the matmul after the norms, attention or SwiGLU into L2.
    ab_want KILN_NO_CUDA_L2_PREFETCH && step ab-KILN_NO_CUDA_L2_PREFETCH "$KILN" bench -m "$WORK/q06-q4km.gguf" \
        -m "$WORK/q8b-q4km.gguf" -m "$WORK/q8b-q8.gguf" --device cuda -p 16 -b 16 -n 128 -r 3 \
        --ab KILN_NO_CUDA_L2_PREFETCH=1
    ab_want KILN_NO_CUDA_PDL && step ab-KILN_NO_CUDA_PDL "$KILN" bench -m "$WORK/q06-q4km.gguf" -m "$WORK/q8b-q4km.gguf" --device cuda \
        -p 16 -b 16 -n 128 -r 2 --ab KILN_NO_CUDA_PDL=1
    for flag in KILN_NO_CUDA_FUSE KILN_NO_CUDA_GEMV KILN_NO_CUDA_SPLIT_KV KILN_NO_CUDA_GEMV_STAGE \
        KILN_NO_CUDA_EARLY_WEIGHTS; do
        ab_want "$flag" && step "ab-$flag" "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 0 -n 128 -r 2 --ab "$flag=1"
    done
    step ab-KILN_NO_CUDA_PREFILL_MMA "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q8b-q8.gguf" --device cuda \
        -p 512 -b 512 -n 0 -r 2 --ab KILN_NO_CUDA_PREFILL_MMA=1
    step ab-KILN_NO_CUDA_PREFILL_K8 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 512 -b 512 -n 0 -r 2 \
        --ab KILN_NO_CUDA_PREFILL_K8=1
    step ab-KILN_NO_CUDA_BLOCK_MMA "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 16 -b 16 -n 0 -r 3 \
        --ab KILN_NO_CUDA_BLOCK_MMA=1
    step ab-KILN_NO_CUDA_BLOCK_DIRECT "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda \
        -p 16 -b 16 -n 0 -r 3 --ab KILN_NO_CUDA_BLOCK_DIRECT=1
    step ab-KILN_NO_CUDA_BLOCK_RING "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda \
        -p 16 -b 16 -n 0 -r 3 --ab KILN_NO_CUDA_BLOCK_RING=1
    step ab-KILN_NO_CUDA_BLOCK_TILE16 env KILN_NO_CUDA_BLOCK_DIRECT=1 "$KILN" bench -m "$WORK/q8b-q4km.gguf" \
        -m "$WORK/q06-q4km.gguf" --device cuda -p 16 -b 16 -n 0 -r 3 --ab KILN_NO_CUDA_BLOCK_TILE16=1
    step ab-KILN_NO_CUDA_K8 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 16 -b 16 -n 128 -r 2 \
        --ab KILN_NO_CUDA_K8=1
    step ab-KILN_NO_CUDA_FLASH_ATTN "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 4096 -b 512 -n 0 -r 2 \
        --ab KILN_NO_CUDA_FLASH_ATTN=1
    say "bench (CUDA):"
    for f in bench-tg bench-block16 bench-pp ab-KILN_NO_CUDA_GRAPH ab-KILN_NO_CUDA_PREP_IN_SPLIT \
        ab-KILN_NO_CUDA_SPLIT_DIRECT ab-KILN_NO_CUDA_ATTN_HEAD_SPLIT ab-KILN_NO_CUDA_ATTN_FIT_GRID \
        ab-KILN_NO_CUDA_PREP_ROWS_IN_SPLIT ab-KILN_NO_CUDA_L2_PREFETCH ab-KILN_NO_CUDA_PDL ab-KILN_NO_CUDA_FUSE \
        ab-KILN_NO_CUDA_GEMV ab-KILN_NO_CUDA_SPLIT_KV ab-KILN_NO_CUDA_GEMV_STAGE ab-KILN_NO_CUDA_EARLY_WEIGHTS \
        ab-KILN_NO_CUDA_PREFILL_MMA ab-KILN_NO_CUDA_PREFILL_K8 \
        ab-KILN_NO_CUDA_BLOCK_MMA ab-KILN_NO_CUDA_BLOCK_DIRECT ab-KILN_NO_CUDA_BLOCK_RING ab-KILN_NO_CUDA_BLOCK_TILE16 \
        ab-KILN_NO_CUDA_K8 ab-KILN_NO_CUDA_FLASH_ATTN; do
        grep -E "^\||ratio|median" "$OUT/$f.log" 2>/dev/null | tee -a "$OUT/summary.txt"
    done
    # The issue table's tg128 @ d32768 row (f16 KV: +4.8 GB a token) and a middle depth.
    step bench-depth timeout 400 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 0 -n 128 -d 4096,32768 -r 2
    grep -E "^\|" "$OUT/bench-depth.log" | tee -a "$OUT/summary.txt"
fi

# 3b. Prefill matmuls on cuBLAS (bf16 copies of the weights, the default from 17 rows) against the int8 kernels
# (KILN_NO_CUDA_PREFILL_BLAS): by rows a pass around the switch-over, then the issue's pp512 / pp4096 in chunks
# of 512 and the 4096-token prompt in one pass.
if want prefill; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    synth synth-8b-q8 "$WORK/q8b-q8.gguf" --arch qwen3 --preset 8b --quant q8_0 "${tok[@]}"
    step prefill-rows "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 32,64,128,256 -b 256 -n 0 -r 2 \
        --ab KILN_NO_CUDA_PREFILL_BLAS=1
    step prefill-pp "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q8b-q8.gguf" --device cuda -p 512,4096 \
        -b 512 -n 0 -r 2 --ab KILN_NO_CUDA_PREFILL_BLAS=1
    step prefill-one-pass "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 4096 -b 4096 -n 0 -r 2
    say "prefill (CUDA, cuBLAS vs int8 kernels):"
    grep -hE "^\||ratio|GiB" "$OUT/prefill-rows.log" "$OUT/prefill-pp.log" "$OUT/prefill-one-pass.log" |
        tee -a "$OUT/summary.txt"
fi

# 3c. Frontier mode (prefill in chunks of 512 to each frontier, then 32 decoded tokens), and the prefill path's
# logits (cuBLAS matmuls, flash attention) against the decode-path kernels' at every frontier (KL, top-1).
if want frontier; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    cat README.md docs/*.md crates/*/src/lib.rs 2>/dev/null | head -c 60000 >"$WORK/text.txt"
    fr=(bench -m "$WORK/q8b-q4km.gguf" --device cuda -b 512 --ctx-start 2048 --ctx-max 32768 --step-mul 4
        --gen-tokens 32 --prompt-file "$WORK/text.txt")
    step frontier timeout 300 "$KILN" "${fr[@]}" --dump-frontier-logits-dir "$WORK/frontier-fast"
    step frontier-int8 timeout 300 env KILN_NO_CUDA_PREFILL_BLAS=1 "$KILN" "${fr[@]}" \
        --ref-frontier-logits "$WORK/frontier-fast"
    step frontier-decode-path timeout 300 env KILN_NO_CUDA_PREFILL_BLAS=1 KILN_NO_CUDA_PREFILL_MMA=1 \
        KILN_NO_CUDA_FLASH_ATTN=1 "$KILN" "${fr[@]}" --ref-frontier-logits "$WORK/frontier-fast"
    grep -E "^\||frontier" "$OUT/frontier.log" "$OUT/frontier-int8.log" "$OUT/frontier-decode-path.log" |
        tee -a "$OUT/summary.txt"
fi

# 3d. `kiln serve` on the GPU (STEPS=serve): the 8B Q4_K_M behind the server, 4 slots; tools/serve-check.py sends
# greedy completions (short prompts and one of ~3,000 tokens: six prefill chunks of 512) alone and then all at
# once, streamed and not: every concurrent text must equal its solo text (prompt chunks in prefill passes of their
# own, decode rows batch-invariant). Then the same server with a DFlash drafter (random, z-lab's 8B shape): the
# scheduler's speculative rows in the same passes, and every text equal to the plain server's.
if want serve; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    cat README.md docs/*.md crates/*/src/lib.rs 2>/dev/null | head -c 60000 >"$WORK/text.txt"
    # serve_check NAME "CHECK ARGS" SERVE ARGS...: kiln serve with the extra arguments, serve-check.py against it.
    serve_check() {
        local name=$1 check=$2
        shift 2
        local port=$((20000 + RANDOM % 20000))
        "$KILN" serve -m "$WORK/q8b-q4km.gguf" --device cuda --port "$port" -c 32768 --parallel 4 "$@" \
            >"$OUT/$name-server.log" 2>&1 &
        local spid=$!
        for _ in $(seq 1 1200); do
            grep -q "ready on" "$OUT/$name-server.log" && break
            kill -0 "$spid" 2>/dev/null || break
            sleep 0.1
        done
        # Not `step`: the server is stopped whatever the check says.
        say "$name: tools/serve-check.py on kiln serve --device cuda (8B Q4_K_M, 4 slots) $*"
        timeout 300 python3 tools/serve-check.py "http://127.0.0.1:$port" --long-file "$WORK/text.txt" \
            --max-tokens 64 $check >"$OUT/$name-check.log" 2>&1
        local rc=$?
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        grep -E "^(round|serve-check|FAIL)" "$OUT/$name-check.log" | tee -a "$OUT/summary.txt"
        if [ $rc -ne 0 ]; then
            say "FAILED: $name (exit $rc); last lines of $name-server.log:"
            tail -n 20 "$OUT/$name-server.log" | tee -a "$OUT/summary.txt"
            exit 1
        fi
    }
    serve_check serve "--save $WORK/serve-solo.json"
    synth synth-draft-8b "$WORK/d8b-q8.gguf" --arch dflash --target "$WORK/q8b-q4km.gguf" --quant q8_0
    serve_check serve-dflash "--expect $WORK/serve-solo.json" --draft "$WORK/d8b-q8.gguf"
fi

# 4. Qwen3-MoE: a synth 30B-A3B Q4_K_M (128 experts, 8 a token): decode, a 16-row block and prefill, the
# experts grouped by expert from 2 rows (GEMV tiles; prefill passes on the tensor-core prefill kernel).
if want moe; then
    synth synth-30b-a3b "$WORK/q30b-a3b-q4km.gguf" --arch qwen3moe --preset 30b-a3b --quant q4_k_m "${tok[@]}"
    step bench-moe timeout 400 "$KILN" bench -m "$WORK/q30b-a3b-q4km.gguf" --device cuda -p 16,512,4096 -b 512 \
        -n 128 -r 2
    # The router (F32 weights) on f32 cuBLAS against matmul_f.
    step ab-moe-KILN_NO_CUDA_PREFILL_BLAS_FLOAT "$KILN" bench -m "$WORK/q30b-a3b-q4km.gguf" --device cuda -p 4096 \
        -b 512 -n 0 -r 2 --ab KILN_NO_CUDA_PREFILL_BLAS_FLOAT=1
    # The tokens' quantized activations gathered into expert order against the f32 rows quantized per choice.
    step ab-moe-KILN_NO_CUDA_MOE_GATHER_QUANT "$KILN" bench -m "$WORK/q30b-a3b-q4km.gguf" --device cuda -p 4096 \
        -b 512 -n 0 -r 2 --ab KILN_NO_CUDA_MOE_GATHER_QUANT=1
    # Grouping off (one GEMV per choice) at a verify-sized pass; the prefill kernel off (GEMV tiles) at pp512.
    step ab-KILN_NO_CUDA_MOE_GROUP "$KILN" bench -m "$WORK/q30b-a3b-q4km.gguf" --device cuda -p 16 -n 0 \
        -r 2 --ab KILN_NO_CUDA_MOE_GROUP=1
    step ab-moe-KILN_NO_CUDA_PREFILL_MMA "$KILN" bench -m "$WORK/q30b-a3b-q4km.gguf" --device cuda -p 512 -b 512 \
        -n 0 -r 2 --ab KILN_NO_CUDA_PREFILL_MMA=1
    # The attention projections on cuBLAS (the experts stay on the grouped int8 kernel) at pp4096.
    step ab-moe-KILN_NO_CUDA_PREFILL_BLAS "$KILN" bench -m "$WORK/q30b-a3b-q4km.gguf" --device cuda -p 4096 -b 512 \
        -n 0 -r 2 --ab KILN_NO_CUDA_PREFILL_BLAS=1
    # The 4096-token prompt in one pass (full expert tiles: ~256 slots an expert).
    step bench-moe-one-pass "$KILN" bench -m "$WORK/q30b-a3b-q4km.gguf" --device cuda -p 4096 -b 4096 -n 0 -r 2
    # The expert tiles' rows past their last (most tiles hold ~32 of 64 slots at chunks of 512) computed anyway
    # (slow: each process compiles the kernels with the define).
    step ab-moe-MQ_SKIP_DEAD "$KILN" bench -m "$WORK/q30b-a3b-q4km.gguf" --device cuda -p 4096 -b 512 -n 0 -r 2 \
        --ab "KILN_CUDA_DEFINES=-DMQ_SKIP_DEAD=0"
    say "Qwen3-MoE (CUDA):"
    grep -E "^\|" "$OUT/bench-moe.log" "$OUT/ab-KILN_NO_CUDA_MOE_GROUP.log" \
        "$OUT/ab-moe-KILN_NO_CUDA_PREFILL_MMA.log" "$OUT/ab-moe-KILN_NO_CUDA_PREFILL_BLAS.log" \
        "$OUT/bench-moe-one-pass.log" "$OUT/ab-moe-KILN_NO_CUDA_PREFILL_BLAS_FLOAT.log" \
        "$OUT/ab-moe-KILN_NO_CUDA_MOE_GATHER_QUANT.log" \
        "$OUT/ab-moe-MQ_SKIP_DEAD.log" | tee -a "$OUT/summary.txt"
fi

# 5. DFlash on the GPU: the drafter's step and the verify block against plain decoding, at forced acceptance
# (the drafter computes for real; drafts replaced by the plain continuation, at most K accepted a round).
if want dflash; then
    # Greedy output equal to plain decoding: a tiny target on the GPU with a random drafter on the GPU, and with
    # the same drafter given a sliding-window first layer (which runs on the CPU, its target on the GPU).
    synth synth-tiny-q8 "$WORK/tiny-q8.gguf" --arch qwen3 --preset tiny --quant q8_0
    [ -s "$WORK/d-tiny/config.json" ] ||
        step synth-draft-tiny "$KILN" synth --arch dflash --target "$WORK/tiny-q8.gguf" --quant bf16 -o "$WORK/d-tiny"
    rm -rf "$WORK/d-tiny-sliding" && cp -r "$WORK/d-tiny" "$WORK/d-tiny-sliding"
    python3 - "$WORK/d-tiny-sliding/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(use_sliding_window=True, sliding_window=3,
         layer_types=["sliding_attention"] + ["full_attention"] * (c["num_hidden_layers"] - 1))
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
    # And the GPU drafter on a Q4_K_M target, whose Q6_K head the drafter reads through the K8 block kernel, with
    # all 15 drafts a round and with 5 (6-row verify blocks: the block kernel's one-tile form).
    synth synth-tiny-q4km "$WORK/tiny-q4km.gguf" --arch qwen3 --preset tiny --quant q4_k_m
    for spec in "d-tiny tiny-q8 15" "d-tiny-sliding tiny-q8 15" "d-tiny tiny-q4km 15" "d-tiny tiny-q4km 5"; do
        read -r d target k <<<"$spec"
        for p in "Once upon a time" "The quick brown fox jumps over"; do
            run=("$KILN" run -m "$WORK/$target.gguf" --device cuda --temp 0 -n 48 -p "$p")
            "${run[@]}" >"$WORK/plain.txt" 2>>"$OUT/run-plain.log" &&
                "${run[@]}" --draft "$WORK/$d" --draft-max "$k" >"$WORK/spec.txt" 2>>"$OUT/run-$d.log" &&
                cmp -s "$WORK/spec.txt" "$WORK/plain.txt" && say "same as plain: $d on $target, $k drafts, '$p'" ||
                { say "FAILED: $d on $target, $k drafts, '$p': an error or other text than plain decoding (run-$d.log)"
                    exit 1; }
        done
    done
    step bench-dflash-sliding "$KILN" bench -m "$WORK/tiny-q8.gguf" --device cuda --draft "$WORK/d-tiny-sliding" \
        --draft-force 3,6 -d 64 -n 64 -r 1
    grep -E "^\|" "$OUT/bench-dflash-sliding.log" | tee -a "$OUT/summary.txt"
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    synth synth-draft-8b "$WORK/d8b-q8.gguf" --arch dflash --target "$WORK/q8b-q4km.gguf" --quant q8_0
    step bench-dflash timeout 400 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda --draft "$WORK/d8b-q8.gguf" \
        --draft-force 3,6,9 --draft-max 7,15 -d 256 -n 128 -r 2
    # Rounds that verify as many drafts as the forced acceptance takes (3, 6, 9: the count `--draft-max auto`
    # settles on when every round accepts exactly k), against the fixed 7 and 15 above.
    step bench-dflash-k timeout 300 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda --draft "$WORK/d8b-q8.gguf" \
        --draft-force 3,6,9 --draft-max 3,6,9 -d 256 -n 128 -r 2
    # The drafter's context features through the host (read back, reordered, uploaded) instead of gathered on the
    # device; then DFlash in a 4,096-token slot, as `kiln run` has by default, with the attention's split grid
    # fitted to the span and not.
    ab_want KILN_NO_CUDA_DEVICE_TAPS && step ab-KILN_NO_CUDA_DEVICE_TAPS timeout 300 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda \
        --draft "$WORK/d8b-q8.gguf" --draft-force 3,6 --draft-max 7 -d 256 -n 128 -r 2 --ab KILN_NO_CUDA_DEVICE_TAPS=1
    ab_want KILN_NO_CUDA_ATTN_FIT_GRID && step ab-dflash-KILN_NO_CUDA_ATTN_FIT_GRID timeout 300 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda \
        --draft "$WORK/d8b-q8.gguf" --draft-force 3,6 --draft-max 7 -d 256 -n 128 -c 4096 -r 2 \
        --ab KILN_NO_CUDA_ATTN_FIT_GRID=1
    # The verify block's attention prep in attn_prep before the split kernel instead of inside it.
    ab_want KILN_NO_CUDA_PREP_ROWS_IN_SPLIT && step ab-dflash-KILN_NO_CUDA_PREP_ROWS_IN_SPLIT timeout 300 "$KILN" \
        bench -m "$WORK/q8b-q4km.gguf" --device cuda --draft "$WORK/d8b-q8.gguf" --draft-force 3,9 --draft-max 7,15 \
        -d 256 -n 128 -r 2 --ab KILN_NO_CUDA_PREP_ROWS_IN_SPLIT=1
    # The target's GEMVs and verify blocks without the L2 prefetch of the next matmul's weights.
    ab_want KILN_NO_CUDA_L2_PREFETCH && step ab-dflash-KILN_NO_CUDA_L2_PREFETCH timeout 300 "$KILN" bench \
        -m "$WORK/q8b-q4km.gguf" --device cuda --draft "$WORK/d8b-q8.gguf" --draft-force 3,9 --draft-max 7,15 \
        -d 256 -n 128 -r 2 --ab KILN_NO_CUDA_L2_PREFETCH=1
    # The drafter block's QK-norm, RoPE and K/V store as four launches and a store instead of attn_prep.
    ab_want KILN_NO_CUDA_DRAFTER_FUSED_ATTN && step ab-KILN_NO_CUDA_DRAFTER_FUSED_ATTN timeout 300 "$KILN" bench \
        -m "$WORK/q8b-q4km.gguf" --device cuda --draft "$WORK/d8b-q8.gguf" --draft-force 3,6 --draft-max 7 -d 256 \
        -n 128 -r 2 --ab KILN_NO_CUDA_DRAFTER_FUSED_ATTN=1
    # The Q8_0 drafter kernel bounded to 3 blocks a multiprocessor (it spills; its Q/K/V launch fits one wave).
    ab_want Q8D_MINB && step ab-dflash-Q8D_MINB timeout 300 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda \
        --draft "$WORK/d8b-q8.gguf" --draft-force 3,6 --draft-max 7 -d 256 -n 128 -r 2 \
        --ab KILN_CUDA_DEFINES=-DQ8D_MINB=3
    # The Q8_0 drafter's blocks on cuBLAS against bf16 copies instead of the Q8_0 block kernel.
    ab_want KILN_NO_CUDA_DRAFTER_Q8 && step ab-KILN_NO_CUDA_DRAFTER_Q8 timeout 400 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda \
        --draft "$WORK/d8b-q8.gguf" --draft-force 3,9 --draft-max 7,15 -d 256 -n 128 -r 2 --ab KILN_NO_CUDA_DRAFTER_Q8=1
    # Without the Q8_0 block kernel: the drafter's matmuls on the block kernels with the GEMV's bits instead of
    # cuBLAS, and the target's Q6_K head on cuBLAS (a bf16 copy) like its layers instead of the K8 block kernel.
    ab_want KILN_NO_CUDA_DRAFTER_BLAS && step ab-KILN_NO_CUDA_DRAFTER_BLAS env KILN_NO_CUDA_DRAFTER_Q8=1 timeout 400 "$KILN" bench -m "$WORK/q8b-q4km.gguf" \
        --device cuda --draft "$WORK/d8b-q8.gguf" --draft-force 9 --draft-max 15 -d 256 -n 128 -r 2 \
        --ab KILN_NO_CUDA_DRAFTER_BLAS=1
    ab_want KILN_NO_CUDA_DRAFT_HEAD_K8 && step ab-KILN_NO_CUDA_DRAFT_HEAD_K8 env KILN_NO_CUDA_DRAFTER_Q8=1 timeout 400 "$KILN" bench -m "$WORK/q8b-q4km.gguf" \
        --device cuda --draft "$WORK/d8b-q8.gguf" --draft-force 9 --draft-max 15 -d 256 -n 128 -r 2 \
        --ab KILN_NO_CUDA_DRAFT_HEAD_K8=1
    # The drafter as z-lab publishes it (a directory of bf16 safetensors): its BF16 matmuls on cuBLAS as uploaded
    # against matmul_f.
    ab_want bf16 && [ ! -s "$WORK/d8b-bf16/config.json" ] &&
        step synth-draft-8b-bf16 "$KILN" synth --arch dflash --target "$WORK/q8b-q4km.gguf" --quant bf16 \
            -o "$WORK/d8b-bf16"
    ab_want bf16 && step ab-bf16-KILN_NO_CUDA_PREFILL_BLAS_FLOAT timeout 400 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda \
        --draft "$WORK/d8b-bf16" --draft-force 9 --draft-max 15 -d 256 -n 128 -r 2 --ab KILN_NO_CUDA_PREFILL_BLAS_FLOAT=1
    say "DFlash (CUDA, forced acceptance):"
    grep -hE "^\||dflash|τ|tau" "$OUT/bench-dflash.log" "$OUT/bench-dflash-k.log" "$OUT/ab-KILN_NO_CUDA_DEVICE_TAPS.log" \
        "$OUT/ab-dflash-KILN_NO_CUDA_ATTN_FIT_GRID.log" "$OUT/ab-dflash-KILN_NO_CUDA_PREP_ROWS_IN_SPLIT.log" \
        "$OUT/ab-dflash-KILN_NO_CUDA_L2_PREFETCH.log" \
        "$OUT/ab-KILN_NO_CUDA_DRAFTER_FUSED_ATTN.log" \
        "$OUT/ab-dflash-Q8D_MINB.log" \
        "$OUT/ab-KILN_NO_CUDA_DRAFTER_Q8.log" \
        "$OUT/ab-KILN_NO_CUDA_DRAFTER_BLAS.log" \
        "$OUT/ab-KILN_NO_CUDA_DRAFT_HEAD_K8.log" "$OUT/ab-bf16-KILN_NO_CUDA_PREFILL_BLAS_FLOAT.log" 2>/dev/null |
        tee -a "$OUT/summary.txt"
fi

# 5b. Kernel constants (STEPS=tune, not in the default): for each set in TUNE (sets separated by spaces, the
# options of a set by ';', e.g. TUNE="-DAT_MIN_CHUNK=64 -DGV_U=2;-DAT_U=2"), the self-test with the kernels built
# that way, then an interleaved A/B against the defaults on the 8B and 0.6B Q4_K_M (decode and a 16-row block) and
# on the 8B's decode at depth 32,768.
if want tune; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    synth synth-06b-q4km "$WORK/q06-q4km.gguf" --arch qwen3 --preset 0.6b --quant q4_k_m "${tok[@]}"
    i=0
    for defs in ${TUNE:-}; do
        i=$((i + 1))
        step "tune-$i-selftest" env KILN_CUDA_DEFINES="$defs" "$KILN" selftest --device cuda
        step "tune-$i" "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda -p 16 -b 16 \
            -n 128 -r 2 --ab "KILN_CUDA_DEFINES=$defs"
        # Attention constants matter at depth: the 8B's decode with 32,768 positions in the cache.
        step "tune-$i-depth" "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 0 -n 64 -d 32768 -r 2 \
            --ab "KILN_CUDA_DEFINES=$defs"
        say "tune $defs:"
        grep -E "^(all|FAIL)" "$OUT/tune-$i-selftest.log" | tee -a "$OUT/summary.txt"
        grep -hE "^\|" "$OUT/tune-$i.log" "$OUT/tune-$i-depth.log" | tee -a "$OUT/summary.txt"
    done
fi

# 5c. What each launch costs in place (STEPS=ablate, not in the default): the 8B Q4_K_M's tg128 with all launches
# and without one kernel or weight role at a time (`kiln bench --skip-each`: KILN_CUDA_TIMING_SKIP's patterns set
# in one process, the variants interleaved per repetition; the outputs of those runs are wrong, their time is the
# point). The table's Δ µs/t column is minus that launch's share of a token inside the graph, overlap with its
# neighbours included, which ncu (kernels alone) does not give. ABLATE overrides the list (sets separated by
# spaces, a set's patterns by commas).
if want ablate; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    step ablate "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 0 -n 128 -r 3 --skip-each \
        "${ABLATE:-attn_q attn_v attn_output ffn_gate ffn_down output attn_split attn_merge rms_norm_q8 swiglu_q8}"
    say "in-place cost of each launch kind (8B Q4_K_M tg128):"
    grep -E "^\|" "$OUT/ablate.log" | tee -a "$OUT/summary.txt"
    # The same for a 16-row block through the decode path (a verify's shape), which also runs attn_prep apart.
    step ablate-block16 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda -p 16 -b 16 -n 0 -r 5 --skip-each \
        "${ABLATE_BLOCK:-attn_q attn_v attn_output ffn_gate ffn_down output attn_prep attn_split attn_merge rms_norm_q8 swiglu_q8}"
    say "in-place cost of each launch kind (8B Q4_K_M, 16-row block):"
    grep -E "^\|" "$OUT/ablate-block16.log" | tee -a "$OUT/summary.txt"
    # The four matmul launches in place on the 4-warp K8 block kernel (by size, and its 32-output tiles alone), to
    # set against the direct kernel's in the table above (in place, a kernel's cost can differ from ncu's time of
    # it alone: its launches overlap their neighbours or not).
    for spec in 4warp:KILN_NO_CUDA_BLOCK_DIRECT=1 4warp32:KILN_NO_CUDA_BLOCK_DIRECT=1,KILN_NO_CUDA_BLOCK_TILE16=1; do
        vars=${spec#*:}
        step "ablate-block16-${spec%%:*}" env ${vars//,/ } "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda \
            -p 16 -b 16 -n 0 -r 3 --skip-each "attn_q attn_output ffn_gate ffn_down"
        say "in-place cost of the matmul launches, ${spec#*:} (8B Q4_K_M, 16-row block):"
        grep -E "^\|" "$OUT/ablate-block16-${spec%%:*}.log" | tee -a "$OUT/summary.txt"
    done
fi

# The K8 block kernels by launch (STEPS=block16): which kernel and tile each of a layer's launches takes, and its
# time alone (ncu, graphs off, the first two layers skipped), under each launch rule; then the end-to-end A/B.
# BLOCK16_NCU=0 leaves out the ncu tables and BLOCK16_BASE=0 the direct-vs-4-warp A/B (a short call then holds the
# tuning defines' A/Bs alone).
if want block16; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    synth synth-06b-q4km "$WORK/q06-q4km.gguf" --arch qwen3 --preset 0.6b --quant q4_k_m "${tok[@]}"
    ncu_models=()
    [ "${BLOCK16_NCU:-1}" != 0 ] && command -v ncu >/dev/null && ncu_models=(q8b-q4km q06-q4km)
    for m in "${ncu_models[@]}"; do
        # tag:environment, variables separated by ',' (the default's is a no-op assignment).
        for spec in direct:KILN_BLOCK16_RULE=default 4warp:KILN_NO_CUDA_BLOCK_DIRECT=1 \
            4warp32:KILN_NO_CUDA_BLOCK_DIRECT=1,KILN_NO_CUDA_BLOCK_TILE16=1; do
            tag=${spec%%:*} vars=${spec#*:}
            step "block16-$m-$tag" env ${vars//,/ } KILN_NO_CUDA_GRAPH=1 timeout 120 ncu --clock-control none \
                -k "regex:^gemv16_k8" --launch-skip 8 --launch-count 4 --section SpeedOfLight \
                "$KILN" bench -m "$WORK/$m.gguf" --device cuda -p 16 -b 16 -n 0 -r 1
            say "block16 $m $tag (kernel, grid, µs of Q/K/V, o-proj, gate/up, down):"
            grep -E "^  gemv16|Duration" "$OUT/block16-$m-$tag.log" | sed 's/Context.*//' | paste - - |
                tee -a "$OUT/summary.txt"
        done
    done
    # The 16-row block with and without the direct kernel, and tg128 beside it, so the block's cost against a step
    # reads off one table (block µs = 16e6 / pp16 t/s, step µs = 1e6 / tg t/s); then without the direct kernel's
    # weight ring. BLOCK16_BASE=0 leaves both out, for a short call that only A/Bs the tuning defines below.
    if [ "${BLOCK16_BASE:-1}" != 0 ]; then
        step block16-ab "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda -p 16 -b 16 \
            -n 128 -r 3 --ab KILN_NO_CUDA_BLOCK_DIRECT=1
        grep -E "^\||ratio" "$OUT/block16-ab.log" | tee -a "$OUT/summary.txt"
        step block16-ab-ring "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda \
            -p 16 -b 16 -n 0 -r 3 --ab KILN_NO_CUDA_BLOCK_RING=1
        grep -E "^\||ratio" "$OUT/block16-ab-ring.log" | tee -a "$OUT/summary.txt"
    fi
    # The direct kernel's tuning defines (B = each; off by default): code sums packed by the K8 writers, and an L2
    # prefetch of the super-block two ahead on the register pipeline (without the ring; both measured on the
    # H100 against the kernels before, and lost on the 8B, docs/PERFORMANCE.md). B16_AB replaces the list
    # (tag:defines, defines separated by ';').
    for v in ${B16_AB:-packed:-DB16_PACKED_SUMS=1 prefetch-noring:-DB16D_PREFETCH=1;-DB16D_RING=0}; do
        step "block16-ab-${v%%:*}" "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda \
            -p 16 -b 16 -n 0 -r 3 --ab "KILN_CUDA_DEFINES=${v#*:}"
        grep -E "^\||ratio" "$OUT/block16-ab-${v%%:*}.log" | tee -a "$OUT/summary.txt"
    done
fi

# Blocks of at most 8 rows (STEPS=n8, not in the default): the direct kernel's one-tile form against the 16-row
# kernel (KILN_NO_CUDA_BLOCK_N8) at 4 and 8 rows beside tg128, its three blocks a multiprocessor against one
# (B16D_N8_MINB=1), then DFlash at forced acceptance 3 and 6 verifying 7 drafts (8 rows) against all 15 (forced
# runs keep `auto` off: they measure a chosen acceptance).
if want n8; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    synth synth-06b-q4km "$WORK/q06-q4km.gguf" --arch qwen3 --preset 0.6b --quant q4_k_m "${tok[@]}"
    step n8-ab "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda -p 4,8 -b 16 -n 128 \
        -r 3 --ab KILN_NO_CUDA_BLOCK_N8=1
    grep -E "^\||ratio" "$OUT/n8-ab.log" | tee -a "$OUT/summary.txt"
    step n8-ab-minb "$KILN" bench -m "$WORK/q8b-q4km.gguf" -m "$WORK/q06-q4km.gguf" --device cuda -p 8 -b 16 -n 0 \
        -r 3 --ab KILN_CUDA_DEFINES=-DB16D_N8_MINB=1
    grep -E "^\||ratio" "$OUT/n8-ab-minb.log" | tee -a "$OUT/summary.txt"
    synth synth-draft-8b "$WORK/d8b-q8.gguf" --arch dflash --target "$WORK/q8b-q4km.gguf" --quant q8_0
    step n8-dflash timeout 400 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda --draft "$WORK/d8b-q8.gguf" \
        --draft-force 3,6 --draft-max 7,15 -d 256 -n 128 -r 2
    grep -E "^\|" "$OUT/n8-dflash.log" | tee -a "$OUT/summary.txt"
    step n8-dflash-ab timeout 400 "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda --draft "$WORK/d8b-q8.gguf" \
        --draft-force 3 --draft-max 7 -d 256 -n 128 -r 2 --ab KILN_NO_CUDA_BLOCK_N8=1
    grep -E "^\||ratio" "$OUT/n8-dflash-ab.log" | tee -a "$OUT/summary.txt"
fi

# Why a kernel takes its time: one layer's four K8 block-kernel launches at 16 rows (Q/K/V, o-proj, gate/up, down:
# `gemv16_k8*`) and its four one-row GEMVs (`gemv3_k8_r1` / `gemv_k8_r1`), the first two layers skipped, with ncu's
# sections for stall reasons, occupancy, issue rate and memory throughput (details in stalls-*.log).
if want stalls && command -v ncu >/dev/null; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    for shape in "block16 gemv16_k8.* -p 16 -b 16 -n 0" "decode gemv3_k8_r1|gemv_k8_r1 -p 0 -n 2"; do
        set -- $shape
        name=$1 kern=$2
        shift 2
        step "stalls-$name" env KILN_NO_CUDA_GRAPH=1 timeout 300 ncu --clock-control none --cache-control none \
            -k "regex:^($kern)$" --launch-skip 8 --launch-count 4 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
            --section InstructionStats "$KILN" bench -m "$WORK/q8b-q4km.gguf" --device cuda "$@" -r 1
        grep -E "^  [a-z_0-9]+.*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issued Ipc|No Eligible|[Ss]tall|Warp Cycles Per Issued|Block Limit" \
            "$OUT/stalls-$name.log" | tee -a "$OUT/summary.txt"
    done
fi

# 6. Where a decode step's time goes: ncu times every kernel alone (graphs off; caches and clocks left as they
# are), 8B and 0.6B Q4_K_M, one-row decode (`-n 6`: a warm-up run and the timed one, 12 steps) and a 16-row block
# (`-p 16 -b 16`: 2 blocks); tools/ncu-summary.py sums each kernel per step.
if want profile && command -v ncu >/dev/null; then
    synth synth-8b-q4km "$WORK/q8b-q4km.gguf" --arch qwen3 --preset 8b --quant q4_k_m "${tok[@]}"
    synth synth-06b-q4km "$WORK/q06-q4km.gguf" --arch qwen3 --preset 0.6b --quant q4_k_m "${tok[@]}"
    models=(q8b-q4km q06-q4km)
    # The 30B-A3B's prefill chunks too when PROFILE names "moe-prefill" (its synth takes ~20 s and 17 GB).
    if [[ " ${PROFILE:-} " == *" moe-prefill "* ]]; then
        synth synth-30b-a3b "$WORK/q30b-a3b-q4km.gguf" --arch qwen3moe --preset 30b-a3b --quant q4_k_m "${tok[@]}"
        models+=(q30b-a3b-q4km)
    fi
    # A DFlash round's kernels when PROFILE names "dflash": `kiln run` of 12 tokens with the 8B-shape Q8_0 drafter
    # (random: it accepts nothing, so each of the 11 rounds is one drafter pass over the block, a one-row context
    # update and an 8-row verify), per round. 12 tokens keep ncu's per-launch cost within the step's 300 s.
    if [[ " ${PROFILE:-} " == *" dflash "* ]]; then
        synth synth-draft-8b "$WORK/d8b-q8.gguf" --arch dflash --target "$WORK/q8b-q4km.gguf" --quant q8_0
        step profile-dflash env KILN_NO_CUDA_GRAPH=1 timeout 300 ncu --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum --print-summary per-kernel --csv "$KILN" run -m "$WORK/q8b-q4km.gguf" \
            --device cuda --temp 0 -n 12 -p "Once upon a time" --draft "$WORK/d8b-q8.gguf" --draft-max 7
        say "ncu, 8B Q4_K_M + 5-layer Q8_0 drafter, 7 drafts (µs a round):"
        python3 tools/ncu-summary.py "$OUT/profile-dflash.log" 11 | tee -a "$OUT/summary.txt"
    fi
    for m in "${models[@]}"; do
        shapes=("decode -p 0 -n 6 12" "block16 -p 16 -b 16 -n 0 2")
        # The 8B's prefill: a 4096-token prompt in chunks of 512 (warm-up and run: 16 chunks), per chunk.
        [ "$m" = q8b-q4km ] && shapes+=("prefill -p 4096 -b 512 -n 0 16")
        # The 30B-A3B's: 1,024 tokens in chunks of 512 (4 chunks with the warm-up).
        [ "$m" = q30b-a3b-q4km ] && shapes=("moe-prefill -p 1024 -b 512 -n 0 4")
        for shape in "${shapes[@]}"; do
            set -- $shape
            name=$1 steps=${*: -1}
            # PROFILE="name ..." (e.g. "prefill") profiles a subset of the shapes.
            [[ -n "${PROFILE:-}" && " $PROFILE " != *" $name "* ]] && continue
            shift
            args=("${@:1:$#-1}")
            step "profile-$m-$name" env KILN_NO_CUDA_GRAPH=1 timeout 300 ncu --clock-control none \
                --cache-control none --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
                "$KILN" bench -m "$WORK/$m.gguf" --device cuda "${args[@]}" -r 1
            say "ncu, $m, $name (µs a step):"
            python3 tools/ncu-summary.py "$OUT/profile-$m-$name.log" "$steps" | tee -a "$OUT/summary.txt"
        done
    done
fi
