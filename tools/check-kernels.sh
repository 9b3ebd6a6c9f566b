#!/usr/bin/env bash
# Compile check of the CUDA kernels without a GPU: installs NVRTC from PyPI (nvidia-cuda-nvrtc 13.0, matching the
# device's CUDA 13.0) under .test-assets/cuda-nvrtc and compiles every kernel with the exact options kiln uses at
# run time, for sm_90a (H200) unless architectures are given: tools/check-kernels.sh [sm_90a sm_80 ...]
# Then disassembles the cubins (cuobjdump + nvdisasm from PyPI; 13.0 is not published there, 13.2 reads 13.0
# cubins) and checks that the kernels that stream weights or the KV cache use 16-byte loads (LDG.E.128, or
# LDGSTS.E.BYPASS.128: a 16-byte cp.async straight into shared memory).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/.test-assets/cuda-nvrtc"
lib="$dir/nvidia/cu13/lib"
bin="$dir/nvidia/cu13/bin"
if [ ! -e "$lib/libnvrtc.so.13" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$dir" 'nvidia-cuda-nvrtc==13.0.*'
fi
if [ ! -x "$bin/nvdisasm" ] || [ ! -x "$bin/cuobjdump" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir.tools" \
        'nvidia-cuda-cuobjdump==13.2.*' 'nvidia-cuda-nvdisasm==13.2.*'
    mkdir -p "$bin"
    cp "$dir.tools/nvidia/cu13/bin/cuobjdump" "$dir.tools/nvidia/cu13/bin/nvdisasm" "$bin/"
    chmod +x "$bin/cuobjdump" "$bin/nvdisasm"
    rm -rf "$dir.tools"
fi
# libnvrtc loads libnvrtc-builtins from the library path.
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$root"
cubins=$(mktemp -d)
trap 'rm -rf "$cubins"' EXIT
KILN_CUBIN_DIR="$cubins" cargo run --quiet -p kiln-cuda --example check_kernels -- "${@:-sm_90a}"
# Kernels whose main loads must be 16-byte vectors.
wide="mmq_q4_k8 mmq_q6_k8 mmq_q8_0 gemv16_k8 gemv16_k8_o16 gemv16_k8d gemv16_k8d_n8 gemv16_q8d gemv16_q8d_n8 gemv_r1 gemv_r8 gemv3_r1 gemv3_r8 gemv_k8_r1 gemv_k8_r8 gemv3_k8_r1 gemv3_k8_r8 attn_flash_h64 attn_flash_h128 attn_split_g1_h64 attn_split_g2_h64 attn_split_g3_h64 attn_split_g4_h64 attn_split_g8_h64 attn_split_g1_h128 attn_split_g2_h128 attn_split_g3_h128 attn_split_g4_h128 attn_split_g8_h128"
for cubin in "$cubins"/*.cubin; do
    PATH="$bin:$PATH" cuobjdump -sass "$cubin" >"$cubins/sass.txt"
    for k in $wide; do
        n=$(awk -v k="$k" '/Function :/ { f = $3 } f == k && /LDG\.E\.128|LDGSTS\.E\.BYPASS\.128/ { n++ } END { print n + 0 }' "$cubins/sass.txt")
        if [ "$n" -eq 0 ]; then
            echo "FAIL $(basename "$cubin" .cubin): $k has no 16-byte load (LDG.E.128 or LDGSTS.E.BYPASS.128) in its SASS" >&2
            exit 1
        fi
        echo "  $k: $n 16-byte loads"
    done
    # The decode GEMVs issue their first weight loads before the wait for the previous kernel (GV_FIRST_WEIGHTS in
    # gemv.cu): on sm_90+ (where the wait is ACQBULK) every wait must follow a 16-byte load of its path.
    # The direct K8 block kernels (gemv16_k8d, gemv16_k8d_n8) load their first super-block's the same way.
    for k in gemv_k8_r1 gemv_k8_r8 gemv3_k8_r1 gemv3_k8_r8 gemv16_k8d gemv16_k8d_n8; do
        bad=$(awk -v k="$k" '/Function :/ { f = $3; n = 0 } f == k && /LDG\.E\.128|LDGSTS\.E\.BYPASS\.128/ { n++ }
            f == k && /ACQBULK/ { if (n == 0) bad++; n = 0 } END { print bad + 0 }' "$cubins/sass.txt")
        if [ "$bad" -ne 0 ]; then
            echo "FAIL $(basename "$cubin" .cubin): $k waits for the previous kernel before loading its first weights" >&2
            exit 1
        fi
    done
done
# The direct kernel's weight ring (B16D_RING, the default): its copies are 16-byte cp.asyncs, the first issued
# before the wait; its Q4_K and Q6_K paths each wait after copies (a third wait, for a type no launch sends,
# copies nothing).
ring_waits() {
    awk -v k="$2" '/Function :/ { f = $3; n = 0 } f == k && /LDGSTS\.E\.BYPASS\.128/ { n++ }
        f == k && /ACQBULK/ { if (n > 0) good++; n = 0 } END { print good + 0 }' "$1"
}
for cubin in "$cubins"/*.cubin; do
    PATH="$bin:$PATH" cuobjdump -sass "$cubin" >"$cubins/sass.txt"
    for k in gemv16_k8d gemv16_k8d_n8; do
        if [ "$(ring_waits "$cubins/sass.txt" "$k")" -lt 2 ]; then
            echo "FAIL $(basename "$cubin" .cubin): $k waits before copying its first weights" >&2
            exit 1
        fi
    done
    # The drafter's Q8_0 block kernels: one type, one ring.
    for k in gemv16_q8d gemv16_q8d_n8; do
        if [ "$(ring_waits "$cubins/sass.txt" "$k")" -lt 1 ]; then
            echo "FAIL $(basename "$cubin" .cubin): $k waits before copying its first weights" >&2
            exit 1
        fi
    done
done
echo "  gemv16_k8d, gemv16_k8d_n8, gemv16_q8d, gemv16_q8d_n8: 16-byte weight copies into their rings issued before the wait"
# The direct kernel without its ring (KILN_NO_CUDA_BLOCK_RING compiles it with B16D_RING=0) and the block
# kernels' tuning variants that tools/device-check.sh self-tests and times must compile too; without the ring
# the direct kernel loads its first weights (LDG.E.128) before the wait.
rm -f "$cubins"/*.cubin
KILN_CUDA_DEFINES="-DB16_PACKED_SUMS=1;-DB16D_PREFETCH=1;-DB16D_RING=0" KILN_CUBIN_DIR="$cubins" \
    cargo run --quiet -p kiln-cuda --example check_kernels -- "${@:-sm_90a}" >/dev/null
for cubin in "$cubins"/*.cubin; do
    PATH="$bin:$PATH" cuobjdump -sass "$cubin" >"$cubins/sass.txt"
    for k in gemv16_k8d gemv16_k8d_n8; do
        good=$(awk -v k="$k" '/Function :/ { f = $3; n = 0 } f == k && /LDG\.E\.128/ { n++ }
            f == k && /ACQBULK/ { if (n > 0) good++; n = 0 } END { print good + 0 }' "$cubins/sass.txt")
        if [ "$good" -lt 2 ]; then
            echo "FAIL $(basename "$cubin" .cubin): $k (B16D_RING=0) waits before loading its first weights" >&2
            exit 1
        fi
    done
done
echo "  B16D_RING=0 with B16_PACKED_SUMS=1, B16D_PREFETCH=1: compiled, first weights loaded before the wait"
