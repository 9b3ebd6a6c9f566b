#!/usr/bin/env bash
# Splits a GGUF into GGUF.part-aa, GGUF.part-ab, ... of at most 30 MB each, so that each part travels in a call with
# a 64 MiB limit next to the ~27 MB of tracked files (40 MB parts fit beside 17 MB, not beside 27), and writes GGUF.sha256;
# device-train.sh joins the parts and refuses the result unless it matches that checksum (a missing part).
#
#   bash tools/dflash-train/split-gguf.sh .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 GGUF" >&2; exit 2; }
rm -f "$1".part-*
split -b 30000000 "$1" "$1.part-"
(cd "$(dirname "$1")" && sha256sum "$(basename "$1")") > "$1.sha256"
ls -l "$1".part-* "$1.sha256"
