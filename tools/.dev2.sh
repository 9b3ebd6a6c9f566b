#!/usr/bin/env bash
python3 -m tarfile -e .test-assets/xfer3/tokq.tar.xz .test-assets/ 2>/dev/null
K=target/carry/kiln
W=/tmp/kiln-device-work; mkdir -p $W
$K selftest --device cuda > /dev/null 2>&1  # warm the kernel cache
timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis -k regex:'^mmq_q' --launch-skip 3 --launch-count 3 $K selftest --device cuda --bench > $OUT/ncu-mmq.txt 2>&1
echo "ncu rc=$?"; grep -E "mmq_q|Duration|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Achieved Occupancy|Registers|Stall|L2 Cache Throughput|DRAM Throughput|Compute \(SM\)" $OUT/ncu-mmq.txt | head -80
$K synth --arch qwen3 --preset 8b --quant q4_k_m --tokenizer .test-assets/tokenizer-qwen3/tokenizer.json -o $W/q8b-q4km.gguf > $OUT/synth.log 2>&1
KILN_NO_CUDA_GRAPH=1 timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-summary per-kernel $K bench -m $W/q8b-q4km.gguf --device cuda -p 4096 -b 512 -n 0 -r 1 > $OUT/ncu-pp4096.csv 2>&1
echo "ncu2 rc=$?"
head -c 1500 $OUT/ncu-pp4096.csv
