#!/usr/bin/env bash
# kiln next to llama.cpp on this CPU, same models, same threads, same text:
#   llama-bench vs kiln bench (pp128, tg64) on SmolLM2-135M Q4_1 and a synthetic Qwen3-0.6B-shape Q4_K_M,
#   llama-perplexity vs kiln score (-c 512) on bench/data/stdlib-docs.txt,
# then the kiln/llama.cpp ratios.
#
# Usage: bench/compare-llamacpp.sh DIR        (or LLAMA_DIR=DIR bench/compare-llamacpp.sh)
# DIR is outside the repository: llama.cpp is downloaded (the llama-cpp-python 0.3.36 source package, which
# vendors it) and built there once (~15 minutes on 2 cores); the synthetic model is written there too.
# Environment: THREADS (2), CTX (512), REPS (3), KILN (path of a kiln binary; default: build target/release/kiln).
# Other processes skew CPU numbers: check `uptime` and run it on an idle machine.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-${LLAMA_DIR:-}}
if [ -z "$work" ]; then
    echo "usage: $0 DIR (a directory outside the repository for llama.cpp and the synthetic model)" >&2
    exit 2
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
case "$work/" in "$root"/*) echo "DIR must be outside the repository" >&2; exit 2 ;; esac
threads=${THREADS:-2}
ctx=${CTX:-512}
reps=${REPS:-3}
ver=0.3.36
src="$work/llama_cpp_python-$ver/vendor/llama.cpp"
bin="$src/build/bin"
assets="$root/.test-assets"
text="$root/bench/data/stdlib-docs.txt"

# --- llama.cpp -----------------------------------------------------------------------------------------------
if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/llama-perplexity" ]; then
    echo "== building llama.cpp $ver (llama-cpp-python source package) in $work" >&2
    python3 -m pip install -q cmake ninja scikit-build-core
    if [ ! -d "$src" ]; then
        (cd "$work" && python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
            "llama-cpp-python==$ver" -d .)
        tar -xzf "$work/llama_cpp_python-$ver.tar.gz" -C "$work"
    fi
    cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF >"$work/cmake.log"
    cmake --build "$src/build" -j "$(nproc)" --target llama-bench llama-perplexity >"$work/build.log"
fi

# --- kiln and the models -------------------------------------------------------------------------------------
kiln=${KILN:-}
if [ -z "$kiln" ]; then
    (cd "$root" && cargo build --release -q -p kiln-cli)
    kiln="$root/target/release/kiln"
fi
smol="$assets/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$smol" ] || { echo "missing $smol: run tools/fetch-test-assets.sh" >&2; exit 1; }
qwen="$work/qwen3-0.6b-shape-q4_k_m.gguf"
if [ ! -f "$qwen" ]; then
    "$kiln" synth --arch qwen3 --preset 0.6b --quant q4_k_m --seed 1 \
        --tokenizer "$assets/tokenizer-qwen3/tokenizer.json" -o "$qwen" >&2
fi

echo "== machine: $(nproc) cores, load: $(uptime | sed 's/.*load average: //')"
echo "== llama.cpp: $(git -C "$src" describe --tags 2>/dev/null || echo "llama-cpp-python $ver vendor tree")"
echo "== kiln: $("$kiln" --version)"

# t/s of one test from llama-bench's JSON (avg_ts) and kiln bench's JSON (same field names).
avg_ts() { python3 -c '
import json, sys
recs = json.load(sys.stdin)
want = {"pp": (int(sys.argv[1]), 0), "tg": (0, int(sys.argv[1]))}[sys.argv[2]]
for r in recs:
    if (r["n_prompt"], r["n_gen"]) == want:
        print("%.2f" % r["avg_ts"]); break
' "$@"; }

rows=()
for model in "$smol" "$qwen"; do
    name=$(basename "$model")
    echo "== $name: llama-bench -p 128 -n 64 -t $threads -r $reps"
    lj=$("$bin/llama-bench" -m "$model" -p 128 -n 64 -t "$threads" -r "$reps" -o json 2>/dev/null)
    echo "== $name: kiln bench -p 128 -n 64 -t $threads -r $reps"
    "$kiln" bench -m "$model" -p 128 -n 64 -t "$threads" -r "$reps" -o md 2>/dev/null | tee "$work/kiln-bench-$name.md"
    kj=$("$kiln" bench -m "$model" -p 128 -n 64 -t "$threads" -r "$reps" -o json 2>/dev/null)
    for t in pp:128 tg:64; do
        kind=${t%%:*}; n=${t#*:}
        l=$(echo "$lj" | avg_ts "$n" "$kind")
        k=$(echo "$kj" | avg_ts "$n" "$kind")
        rows+=("$name|$kind$n|$l|$k")
    done
done

echo "== perplexity, -c $ctx, $(wc -c <"$text") bytes of $(basename "$text")"
# --no-escape: by default llama.cpp turns the text's literal "\t" and "\n" into control characters, and then
# scores other bytes than kiln does (with it, both tokenize the file to the same 8981 ids).
lp=$("$bin/llama-perplexity" -m "$smol" -f "$text" -c "$ctx" -t "$threads" --no-escape 2>&1 |
    sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 \2/p')
echo "llama-perplexity: PPL = $lp"
kp=$("$kiln" score -m "$smol" -f "$text" -c "$ctx" -t "$threads" --json 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.4f %.5f %d" % (j["ppl"], j["ppl_err"], j["n_tokens"]))')
echo "kiln score:       PPL = $kp"

echo
echo "| model | test | llama.cpp t/s | kiln t/s | kiln/llama.cpp |"
echo "|---|---|---:|---:|---:|"
for r in "${rows[@]}"; do
    IFS='|' read -r name test l k <<<"$r"
    ratio=$(python3 -c "print('%.3f' % ($k / $l))")
    echo "| $name | $test | $l | $k | $ratio |"
done
set -- $lp
lppl=$1
set -- $kp
kppl=$1
python3 -c "print('| SmolLM2 Q4_1 | PPL -c $ctx | %s | %s | %.4f (%+.3f %%) |' % ('$lppl', '$kppl', $kppl/$lppl, 100*($kppl/$lppl-1)))"
