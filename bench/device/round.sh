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
# Ordered by what the session needs most; a call cut off at its limit drops the rest (2026-11-29: the first six
# steps below took 8 minutes).
# 1. INT8 on CUDA: every INT8 rule bit-exact against int8_ref, quantized ONNX chains and zoo models against the x86
#    library (YOLOv8n against its own graph on the CPU, sigmoids in float64); its own step: a slow build loses only
#    itself
step int8_tests 200 python3 -m pytest -q -n 12 -p no:cacheprovider -m gpu \
    tests/schedules/test_cuda_int8.py tests/schedules/test_cuda_int8_models.py
# 2. offline tuning (the #51 logs): the candidates `tvmfuse tune MODEL --target cuda-sm90 --export-candidates DIR` built
#    here (prepare.sh: INT8 ResNet-50 and MobileNetV2, stashed by stage 1); import candidate_times.json here with
#    `tvmfuse tune --import-results ... --candidates DIR`, DIR the unpacked .candidates/candidates.tar.xz
if [ -d /root/stash/candidates ]; then
    step candidates 150 python3 bench/device/time_candidates.py /root/stash/candidates "$W/candidate_times.json"
fi
# 3. the shipped tuning logs (ResNet-50 fp16) against none, #51's bar "tuned faster than untuned"; alternating blocks
step tuned 100 python3 bench/gpu.py --models resnet50 --precisions fp16 --untuned --repeat 30 \
    --json "$W/gpu_tuned.json"
# 4. INT8 latency with fp16 in the same call (quantized on random batches): the TensorRT INT8 anchor's rows
step gpu_int8 200 python3 bench/gpu.py --models resnet50,mobilenet_v2 --precisions fp16,int8 --repeat 30 \
    --json "$W/gpu_int8.json"
# 5. where ResNet-50's INT8 time goes on the GPU, kernel by kernel (its INT8 was 0.95x its fp16 on 2026-11-29)
step profile_int8 80 python3 bench/profile.py resnet50 --target cuda-sm90 --int8 minmax --runs 10 --top 20
# 6. numerics on the device: every CUDA rule against numpy (the fp16 tensor-core conv/dense too), every zoo model
#    against onnxruntime in FP32 and fp16, CUDA graphs against plain launches (83 passed on 2026-11-29)
step gpu_tests 230 python3 -m pytest -q -n 12 -p no:cacheprovider -m gpu \
    tests/schedules/test_cuda_rules.py tests/schedules/test_cuda_tensor_core.py tests/schedules/test_cuda_models.py \
    tests/schedules/test_cuda_group_conv.py tests/schedules/test_cuda_graph.py \
    tests/test_precision.py
# 7. AMX on the host CPU (a Xeon with amx-int8; #52): the tile kernels bit-exact against int8_ref, then ResNet-50
#    INT8 on tiles (x86-host) against VNNI (x86-avx512) on two pinned cores, every output compared exactly
#    (2026-11-29: bit-exact, 0.83x)
step amx_tests 60 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_schedule_x86_amx.py
step amx_check 200 taskset -c 1,2 env TVM_NUM_THREADS=2 python3 bench/amx_check.py --models resnet50 --repeat 30
# 7b. where ResNet-50's INT8 time goes on the tiles (x86-host, two pinned cores): the 0.6x bar's next step
step amx_profile 120 taskset -c 1,2 env TVM_NUM_THREADS=2 python3 bench/profile.py resnet50 --target x86-host \
    --int8 minmax --runs 10 --top 20
# 8. INT8 kernel by kernel (any model that fails against its reference: here YOLOv8n, whose 14 first kernels were
#    bit-exact on 2026-11-29)
step int8_kernels 90 python3 bench/cuda_check_kernels.py zoo:yolov8n --int8
# 9. where ResNet-50's fp16 time goes (graphs off, the device waited for around each call)
step profile_fp16 60 python3 bench/profile.py resnet50 --target cuda-sm90 --precision fp16 --runs 10 --top 20
# 10. the depthwise bar: layers of 56x56 and larger against a copy of as many bytes, FP32 and fp16, each layer also
#     with the other number of channels a thread (fp16's default of two, half2 reads, is not timed yet)
step depthwise_bw 70 python3 bench/cuda_kernels.py --bandwidth --repeat 30
step depthwise_bw_fp16 70 python3 bench/cuda_kernels.py --bandwidth --precision fp16 --repeat 30
# 11. the bar's timing table: tvmfuse FP32 and fp16 against plain TVM and PyTorch eager (FP32: TF32 off and on),
#     GPU-synchronized medians
step gpu_models 200 python3 bench/gpu.py --models mobilenet_v2,efficientnet_lite0,resnet50,resnet18 \
    --precisions fp32,fp16 --repeat 30 --torch --json "$W/gpu_models.json"
# 12. the fuzz slice: random CNNs built here in FP32 and fp16 (bench/device/fuzz_slice.py prepare .fuzz, carried by
#     stage 1) against onnxruntime outputs computed here
if [ -d /root/stash/fuzz ]; then
    step fuzz 90 python3 bench/device/fuzz_slice.py check /root/stash/fuzz "$W/fuzz.json"
fi
# 13. torch.compile, the fp16 contender of the bar (Inductor compiles each model: its own step, so a slow compile
#     loses only itself)
step torch_compile 150 python3 bench/gpu.py --models resnet50,mobilenet_v2,resnet18 --precisions fp16 \
    --repeat 30 --torch --torch-compile --json "$W/gpu_torch_compile.json"
# 14. CUDA graphs on and off, whole models
step cuda_graph 70 python3 bench/cuda_graph.py --models mobilenet_v2,resnet50 --repeat 30
cat "$W/steps.txt"
