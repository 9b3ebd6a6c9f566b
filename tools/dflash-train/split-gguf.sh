#!/usr/bin/env bash
# Splits a GGUF into GGUF.part-aa, GGUF.part-ab, ... of at most 50 MB each, so that it can travel in calls with a
# 64 MiB limit; device-train.sh joins them again.
#
#   bash tools/dflash-train/split-gguf.sh .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 GGUF" >&2; exit 2; }
rm -f "$1".part-*
split -b 50000000 "$1" "$1.part-"
ls -l "$1".part-*
