#!/usr/bin/env bash
# One detached GPU job that compares two training settings on the same data: arm A trains as device-job.sh's job
# does (the target first writes the extra data), then arm B trains on arm A's generated.jsonl (--extra-data) with
# its own arguments, so the arms differ only in those; each arm is converted to Q8_0 and measured with
# eval_kiln.py on the GPU. Starts the job and returns; its log is OUT.log, whose last line is "job finished: rc N".
# Watch it with
#   FINISHED='^job finished' bash tools/dflash-train/device-watch.sh OUT.log SECONDS
# and take OUT-a and OUT-b as device-job.sh's OUT_DIR (config.json, train_log.json, train.log), OUT-{a,b}-q8_0.gguf
# and OUT-{a,b}-eval.{log,json}.
#
#   bash tools/dflash-train/device-ab.sh KILN GGUF OUT MINUTES "A's train.py arguments" "B's train.py arguments"
#
# MINUTES is each arm's training time. Arguments both arms share (--init, --seed, the data's size) go in both
# strings; B's data arguments (--gen-*) have no effect, since B generates nothing.
set -euo pipefail
if [ $# -ne 6 ]; then
    echo "usage: $0 KILN GGUF OUT MINUTES \"A's train.py arguments\" \"B's train.py arguments\"" >&2
    exit 2
fi
kiln=$(realpath "$1") gguf=$2 out=$3 minutes=$4 args_a=$5 args_b=$6
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$kiln" ] || { echo "error: $kiln is not an executable kiln binary" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# arm DIR ARGS...: train over the whole schedule, convert, measure (the eval's tail in the log).
arm='arm() {
    local dir=$1; shift
    bash "$here/device-train.sh" "$gguf" "$dir" "$minutes" --stop-after 0 "$@" &&
    "$kiln" convert-draft "$dir" -o "$dir-q8_0.gguf" --type q8_0 &&
    python3 "$here/eval_kiln.py" --kiln "$kiln" --model "$gguf" --draft "$dir-q8_0.gguf" -n 128 \
        --extra "--device cuda" --json "$dir-eval.json" > "$dir-eval.log" 2>&1
    local rc=$?
    echo "arm $dir:"; tail -n 3 "$dir-eval.log" 2>/dev/null
    return $rc
}'
# The arms' arguments are word-split as a shell would split them on a command line.
setsid nohup env here="$here" gguf="$gguf" kiln="$kiln" minutes="$minutes" bash -c "
set -o pipefail
$arm
arm '$out-a' $args_a && arm '$out-b' --extra-data '$out-a/generated.jsonl' $args_b
echo \"job finished: rc \$?\"
" > "$out.log" 2>&1 < /dev/null &
sleep 2
echo "started: log $out.log"
tail -n 3 "$out.log"
