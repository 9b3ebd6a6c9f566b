#!/usr/bin/env bash
# Compile check of the CUDA kernels without a GPU: installs NVRTC from PyPI (nvidia-cuda-nvrtc 13.0, matching the
# device's CUDA 13.0) under .test-assets/cuda-nvrtc and compiles every kernel with the exact options kiln uses at
# run time, for sm_90a (H200) unless architectures are given: tools/check-kernels.sh [sm_90a sm_80 ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/.test-assets/cuda-nvrtc"
lib="$dir/nvidia/cu13/lib"
if [ ! -e "$lib/libnvrtc.so.13" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$dir" 'nvidia-cuda-nvrtc==13.0.*'
fi
# libnvrtc loads libnvrtc-builtins from the library path.
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$root"
cargo run --quiet -p kiln-cuda --example check_kernels -- "${@:-sm_90a}"
