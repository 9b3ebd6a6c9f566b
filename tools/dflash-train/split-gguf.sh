#!/usr/bin/env bash
# Splits a GGUF into GGUF.part-aa, GGUF.part-ab, ... of at most 40 MB each, so that each part travels in a call with
# a 64 MiB limit next to the ~17 MB of tracked files (a 50 MB part did not fit), and writes GGUF.sha256;
# device-train.sh joins the parts and refuses the result unless it matches that checksum (a missing part).
#
#   bash tools/dflash-train/split-gguf.sh .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 GGUF" >&2; exit 2; }
rm -f "$1".part-*
split -b 40000000 "$1" "$1.part-"
(cd "$(dirname "$1")" && sha256sum "$(basename "$1")") > "$1.sha256"
ls -l "$1".part-* "$1.sha256"
