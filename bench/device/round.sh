#!/usr/bin/env bash
# The prepared GPU round: run right after stage2.sh on the same warm machine, in one call (about 9 minutes:
# bench/device/README.md gives the call). Every step has its own timeout and writes under $OUT as it goes, so a step
# that runs long loses only itself. Commit what comes back (the GPU named in gpu_models.json) and the figures
# in docs/results.md.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# Only 8 files come back from a call: the steps write under $W and, after each step, everything is packed again
# into the one file $OUT/round.tar.gz, so a call cut off by its limit still returns every finished step.
# ROUND_STEPS="int8_tests gpu_int8" runs only the named steps (a second, shorter call).
OUT=${OUT:-/tmp/out}
W=${ROUND_WORK:-/tmp/round}
mkdir -p "$OUT" "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$W/gpu.txt" 2>&1
step() {  # step NAME SECONDS COMMAND...: one line of outcome per step in steps.txt
    local name=$1 limit=$2; shift 2
    if [ -n "${ROUND_STEPS:-}" ] && [[ " $ROUND_STEPS " != *" $name "* ]]; then return; fi
    local start=$SECONDS
    timeout "$limit" "$@" > "$W/$name.txt" 2>&1
    echo "$name: exit $? in $((SECONDS - start)) s" >> "$W/steps.txt"
    tar -C "$W" -czf "$OUT/round.tar.gz.part" . && mv "$OUT/round.tar.gz.part" "$OUT/round.tar.gz"
}
# 1. INT8 on CUDA (the 2026-11-28 round's failures first, the steps never run next): every INT8 rule bit-exact against int8_ref, quantized ONNX chains and zoo models against the x86
#     INT8 kernels (its own step: a slow build loses only itself)
step int8_tests 200 python3 -m pytest -q -n 12 -p no:cacheprovider -m gpu \
    tests/schedules/test_cuda_int8.py tests/schedules/test_cuda_int8_models.py
# 1c. INT8 kernel by kernel: YOLOv8n's INT8 library differed from the x86 one on the H200 (2026-11-28) while
#     every unit case was bit-exact; each of its kernels against the same compute on the CPU names the one
step int8_kernels 90 python3 bench/cuda_check_kernels.py zoo:yolov8n --int8
# 2a. INT8 latency (quantized on random batches), the TensorRT INT8 anchor's rows
step gpu_int8 170 python3 bench/gpu.py --models resnet50,mobilenet_v2 --precisions fp16,int8 --repeat 30 \
    --json "$W/gpu_int8.json"
# 2a'. where ResNet-50's INT8 time goes on the GPU, kernel by kernel (its INT8 was 0.95x its fp16 on 2026-11-29)
step profile_int8 80 python3 bench/profile.py resnet50 --target cuda-sm90 --int8 minmax --runs 10 --top 20
# 2b. offline tuning (the #51 logs): the candidates `tvmfuse tune MODEL --target cuda-sm90 --export-candidates .candidates` built
#    here, carried with the call; import OUT/candidate_times.json with `tvmfuse tune --import-results ... --candidates
#    .candidates`
C=.candidates; [ -d "$C" ] || C=/root/stash/candidates  # carried by this call, or stashed by stage 1
if [ -d "$C" ]; then
    step candidates 120 python3 bench/device/time_candidates.py "$C" "$W/candidate_times.json"
fi
# 2d'. AMX on the host CPU (a Xeon with amx-int8; #52): the tile kernels bit-exact against int8_ref, then ResNet-50
#       INT8 on tiles (x86-host) against VNNI (x86-avx512) on two pinned cores, every output compared exactly
step amx_tests 60 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_schedule_x86_amx.py
step amx_check 200 taskset -c 1,2 env TVM_NUM_THREADS=2 python3 bench/amx_check.py --models resnet50 --repeat 30
# 2. where ResNet-50's fp16 time goes, kernel by kernel (graphs off, the device waited for around each call; the
#    2026-11-28 profile did not come back)
step profile_fp16 60 python3 bench/profile.py resnet50 --target cuda-sm90 --precision fp16 --runs 10 --top 20
# 3. numerics on the device: every CUDA rule against numpy (the fp16 tensor-core conv/dense too), every zoo model
#    against onnxruntime in FP32 and fp16,
#    CUDA graphs against plain launches
step gpu_tests 230 python3 -m pytest -q -n 12 -p no:cacheprovider -m gpu \
    tests/schedules/test_cuda_rules.py tests/schedules/test_cuda_tensor_core.py tests/schedules/test_cuda_models.py \
    tests/schedules/test_cuda_group_conv.py tests/schedules/test_cuda_graph.py \
    tests/test_precision.py
# 2c. the depthwise bar: layers of 56x56 and larger against a copy of as many bytes, FP32 and fp16
step depthwise_bw 50 python3 bench/cuda_kernels.py --bandwidth --repeat 30
step depthwise_bw_fp16 50 python3 bench/cuda_kernels.py --bandwidth --precision fp16 --repeat 30
# 2d. the bar's timing table: tvmfuse FP32 and fp16 against plain TVM and PyTorch eager (FP32: TF32 off and on),
#     GPU-synchronized medians (measured whole on 2026-11-28, so after the steps above)
step gpu_models 200 python3 bench/gpu.py --models mobilenet_v2,efficientnet_lite0,resnet50,resnet18 \
    --precisions fp32,fp16 --repeat 30 --torch --json "$W/gpu_models.json"
# 2e. the fuzz slice: random CNNs built here in FP32 and fp16 (bench/device/fuzz_slice.py prepare .fuzz, carried by
#     stage 1) against onnxruntime outputs computed here
if [ -d /root/stash/fuzz ]; then
    step fuzz 90 python3 bench/device/fuzz_slice.py check /root/stash/fuzz "$W/fuzz.json"
fi
# 3. torch.compile, the fp16 contender of the bar (Inductor compiles each model: its own step, so a slow compile
#    loses only itself)
step torch_compile 150 python3 bench/gpu.py --models resnet50,mobilenet_v2,resnet18 --precisions fp16 \
    --repeat 30 --torch --torch-compile --json "$W/gpu_torch_compile.json"
# 4. CUDA graphs on and off, whole models (measured on 2026-11-22 and -27: last, what a long round drops)
step cuda_graph 70 python3 bench/cuda_graph.py --models mobilenet_v2,resnet50 --repeat 30
cat "$W/steps.txt"
