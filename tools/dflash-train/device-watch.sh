#!/usr/bin/env bash
# Watches a detached device-train.sh job's LOG for up to SECONDS and returns as soon as the job has failed
# (exit 1, with the log's tail) or finished (exit 0), else after SECONDS (exit 0): a watching command that sleeps
# its whole time over a job that died at its start only spends the machine's time.
#
#   bash tools/dflash-train/device-watch.sh LOG SECONDS
#
# FINISHED (an extended regex, default '^wrote ': train.py's last line) is the log line that means finished
# (device-job.sh's is '^job finished').
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 LOG SECONDS" >&2; exit 2; }
log=$1 secs=$2
end=$((SECONDS + secs))
progress() { grep -v '^step [0-9]* [0-9.]* min' "$log" | tail -25; grep '^step [0-9]* [0-9.]* min' "$log" | tail -2; }
while [ $SECONDS -lt $end ]; do
    if [ -f "$log" ] && grep -q -E '^(Traceback|error:)|Error' "$log"; then
        echo "the job failed:"; progress; exit 1
    fi
    if [ -f "$log" ] && grep -q -E "${FINISHED:-^wrote }" "$log"; then
        echo "the job has finished:"; progress; exit 0
    fi
    sleep 5
done
progress
