#!/usr/bin/env bash
# One detached job on a GPU machine: trains over the whole schedule (device-train.sh), converts the drafter to Q8_0
# with kiln, and measures it with eval_kiln.py on the GPU (τ and speed on the held-out prompts). Starts the job and
# returns; its log is OUT_DIR.log, and the job's last line is "job finished: rc N". Watch it with
#   FINISHED='^job finished' bash tools/dflash-train/device-watch.sh OUT_DIR.log SECONDS
# and take OUT_DIR/{config.json,train_log.json,train.log}, OUT_DIR-q8_0.gguf and OUT_DIR-eval.{log,json}.
#
#   bash tools/dflash-train/device-job.sh KILN GGUF OUT_DIR TOTAL_MINUTES [extra train.py arguments]
#
# KILN is a kiln binary built with --features cuda (the GPU machine has no Rust toolchain). OUT_DIR must be
# outside the repository copy a command brings, or in an ignored folder of it, so that it outlives the command.
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 KILN GGUF OUT_DIR TOTAL_MINUTES [extra train.py arguments]" >&2
    exit 2
fi
kiln=$(realpath "$1") gguf=$2 out=$3 minutes=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$kiln" ] || { echo "error: $kiln is not an executable kiln binary" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# Word-split-safe copy of the training arguments for the detached shell.
args=$(printf ' %q' "$@")
setsid nohup bash -c "
set -o pipefail
bash '$here/device-train.sh' '$gguf' '$out' '$minutes' --stop-after 0$args &&
'$kiln' convert-draft '$out' -o '$out-q8_0.gguf' --type q8_0 &&
python3 '$here/eval_kiln.py' --kiln '$kiln' --model '$gguf' --draft '$out-q8_0.gguf' -n 128 \
    --extra '--device cuda' --json '$out-eval.json' > '$out-eval.log' 2>&1
rc=\$?
tail -n 3 '$out-eval.log' 2>/dev/null
echo \"job finished: rc \$rc\"
" > "$out.log" 2>&1 < /dev/null &
sleep 2
echo "started: log $out.log"
tail -n 3 "$out.log"
