#!/usr/bin/env bash
# Trains the SmolLM2 DFlash drafter on a GPU machine and writes it (z-lab format: config.json + bf16
# model.safetensors, plus train_log.json and train.log) to OUT_DIR.
#
#   bash tools/dflash-train/device-train.sh GGUF OUT_DIR TOTAL_MINUTES [extra train.py arguments]
#
# One call trains at most 4 minutes (the first call also has the target generate extra data, ~4-5 minutes) or
# 8 minutes (later calls), so that each call ends within 10 minutes; run the same command again to continue
# until it says "finished" (the state and the generated data stay in OUT_DIR; keep OUT_DIR on the machine).
# Where a job may outlive the command that starts it, one detached job is simpler and loses no time to restarts:
#   setsid nohup bash device-train.sh GGUF OUT_DIR 16 --stop-after 0 > LOG 2>&1 &
# (a later --stop-after overrides this script's; 0 = train over the whole schedule), then watch LOG.
# GGUF may arrive in parts (a 98 MB file over a transfer limit): when GGUF itself is absent, GGUF.part-* are
# concatenated (in name order) into it. Make the parts with tools/dflash-train/split-gguf.sh.
# The weights are also left as model.safetensors.part-* of at most 9 MB (for transfers that cap file sizes;
# `cat` joins them). Needs python3 with torch, transformers, safetensors and numpy; neither the `gguf` package
# nor network access (gguf_target.py reads the GGUF itself). The training data is data.jsonl.gz (committed).
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 GGUF OUT_DIR TOTAL_MINUTES [extra train.py arguments]" >&2
    exit 2
fi
gguf=$1 out=$2 minutes=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)

if [ ! -f "$gguf" ]; then
    parts=("$gguf".part-*)
    if [ ! -f "${parts[0]}" ]; then
        echo "error: $gguf not found, and no $gguf.part-* to join" >&2
        exit 1
    fi
    # Joined at GGUF's own path (the training log names it; a later job finds it there), and only when the
    # joined bytes are the file split-gguf.sh split: a part that did not arrive must stop the job here.
    if [ ! -f "$gguf.sha256" ]; then
        echo "error: $gguf.sha256 not found (split-gguf.sh writes it next to the parts)" >&2
        exit 1
    fi
    cat "${parts[@]}" > "$gguf.tmp"
    if [ "$(sha256sum < "$gguf.tmp" | cut -d' ' -f1)" != "$(cut -d' ' -f1 "$gguf.sha256")" ]; then
        echo "error: the ${#parts[@]} parts of $gguf (${parts[*]}) do not join into the file of $gguf.sha256" >&2
        rm -f "$gguf.tmp"
        exit 1
    fi
    mv "$gguf.tmp" "$gguf"
    echo "joined ${#parts[@]} parts of $gguf ($(stat -c %s "$gguf") bytes, checksum matches)"
fi

python3 - <<'PY'
import torch, transformers, safetensors, numpy
print(f"torch {torch.__version__}, transformers {transformers.__version__}, cuda {torch.cuda.is_available()}"
      + (f" ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ""))
PY

mkdir -p "$out"
call_minutes=4
[ -f "$out/state.pt" ] && call_minutes=8
# GPU defaults: 3 drafter layers, 16 sequences x 64 anchors a step (1024 blocks; the LM head over the 15 drafted
# positions of every block is most of the work). The committed data (~275 training responses) alone overfits within
# a minute on this GPU, so the target first writes much more (fastgen.py, batches of 4096, halved automatically if
# memory runs out; ~41 k tokens/s on an H200): 16 sampled responses per training prompt; extra_prompts.py's 5,295
# prompts of the held-out set's kinds, answered greedily and 4 times sampled; and 30,000 prompts it writes itself,
# answered greedily (a 3-layer drafter trained on self-written prompts alone reached teacher-forced tau ~3.2 on its
# training batches but 2.6 on the held-out prompts). Every training sequence's features (float32 target, stored
# f16 in GPU memory: ~60 GB for ~10 M tokens) and the target's argmax next tokens are computed once before the
# first step; the blocks are labelled with those argmax tokens (--greedy-labels: what verification accepts, where
# most of the data is sampled). Later arguments override these.
export PYTHONUNBUFFERED=1
python3 "$here/train.py" --gguf "$gguf" --data "$here/data.jsonl.gz" --out "$out" --minutes "$minutes" \
    --resume --stop-after "$call_minutes" --cache-features --precompute-features 65536 --greedy-labels \
    --layers 3 --batch 16 --anchors 64 --warmup 100 --eval-every 2 --eval-batch 8 --eval-anchors 64 \
    --gen-samples 16 --gen-prompts 30000 --gen-batch 4096 \
    --gen-prompt-ids "$here/extra_prompts.jsonl.gz" --gen-prompt-samples 4 "$@" 2>&1 | grep --line-buffered -v -i warning | tee -a "$out/train.log"
rm -f "$out"/model.safetensors.part-*
split -b 9000000 "$out/model.safetensors" "$out/model.safetensors.part-"
ls -l "$out"
