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
wanted() { [ -z "${ROUND_STEPS:-}" ] || [[ " $ROUND_STEPS " == *" $1 "* ]]; }
pack() { tar -C "$W" -czf "$OUT/round.tar.gz.part" . && mv "$OUT/round.tar.gz.part" "$OUT/round.tar.gz"; }
run_step() {  # run_step NAME SECONDS COMMAND...: one line of outcome per step in steps.txt
    local name=$1 limit=$2 start=$SECONDS; shift 2
    timeout "$limit" "$@" > "$W/$name.txt" 2>&1
    echo "$name: exit $? in $((SECONDS - start)) s" >> "$W/steps.txt"
}
step() { if wanted "$1"; then run_step "$@"; pack; fi; }
# A check that times nothing runs beside the step after it (both only compare outputs: nothing is timed while
# they share the machine).
beside() { if wanted "$1"; then run_step "$@" & fi; }
# Ordered by what the session needs most; a call cut off at its limit drops the rest. After the 2026-11-30 round (the
# whole round in one 560 s call on an H200, but for two bandwidth steps): what that round's results changed (the
# INT8 records shared over calibration tables, strips of 2 in fp16 and INT8 depthwise tiles) first, then the bar's
# tables.
# 1. numerics on the device, one pytest: every CUDA rule against numpy (the fp16 tensor-core conv/dense, half2
#    depthwise), every zoo model against onnxruntime in FP32 and fp16, CUDA graphs against plain launches, every
#    INT8 rule bit-exact against int8_ref, quantized ONNX chains and zoo models against their references (YOLOv8n
#    against its own graph on the CPU, sigmoids in float64). Beside it the AMX tile kernels on the host Xeon and the
#    fuzz slice: random CNNs built here in FP32 and fp16 (bench/device/fuzz_slice.py prepare .fuzz, carried by
#    stage 1) against onnxruntime outputs computed here.
if [ -d /root/stash/fuzz ]; then
    beside fuzz 150 python3 bench/device/fuzz_slice.py check /root/stash/fuzz "$W/fuzz.json"
fi
beside amx_tests 150 python3 -m pytest -q -p no:cacheprovider tests/schedules/test_schedule_x86_amx.py
step gpu_tests 200 python3 -m pytest -q -n 13 -p no:cacheprovider -m gpu \
    tests/schedules/test_cuda_rules.py tests/schedules/test_cuda_tensor_core.py tests/schedules/test_cuda_models.py \
    tests/schedules/test_cuda_group_conv.py tests/schedules/test_cuda_graph.py tests/test_precision.py \
    tests/schedules/test_cuda_int8.py tests/schedules/test_cuda_int8_models.py
wait; pack
# 2. offline tuning (the #51 logs): the candidates `tvmfuse tune MODEL --target cuda-sm90 --export-candidates DIR` built
#    here (prepare.sh: INT8 ResNet-50 and MobileNetV2, fp16 MobileNetV2's depthwise pairs and tiles, stashed by
#    stage 1); import candidate_times.json here with `tvmfuse tune --import-results ... --candidates DIR`, DIR the
#    unpacked .candidates/candidates.tar.xz
if [ -d /root/stash/candidates ]; then
    step candidates 150 python3 bench/device/time_candidates.py /root/stash/candidates "$W/candidate_times.json"
fi
# 3. the shipped tuning logs against none (#51's bar "tuned faster than untuned"), fp16 and INT8 in one call
#    (alternating blocks): ResNet-50 and MobileNetV2, whose INT8 records were timed on another calibration table and
#    apply through their shared form; the INT8 rows against the fp16 ones are the bar's INT8 / fp16 ratio
step tuned 240 python3 bench/gpu.py --models resnet50,mobilenet_v2 --precisions fp16,int8 --untuned --repeat 30 \
    --json "$W/gpu_tuned.json"
# 4. the depthwise bar: layers of 56x56 and larger against a copy of as many bytes, each layer also with the other
#    number of channels a thread (fp16 and INT8 default tiles take strips of 2 since 2026-11-30)
step depthwise_bw_fp16 70 python3 bench/cuda_kernels.py --bandwidth --precision fp16 --repeat 30
step depthwise_bw 70 python3 bench/cuda_kernels.py --bandwidth --repeat 30
# 5. where ResNet-50's INT8 time goes on the GPU, kernel by kernel (untuned, its INT8 was 1.04x its fp16 on 2026-11-30)
step profile_int8 80 python3 bench/profile.py resnet50 --target cuda-sm90 --int8 minmax --runs 10 --top 20
# 6. the bar's timing table: tvmfuse FP32 and fp16 against plain TVM and PyTorch eager (FP32: TF32 off and on),
#    GPU-synchronized medians
step gpu_models 200 python3 bench/gpu.py --models mobilenet_v2,efficientnet_lite0,resnet50,resnet18 \
    --precisions fp32,fp16 --repeat 30 --torch --json "$W/gpu_models.json"
# 7. torch.compile, the fp16 contender of the bar (Inductor compiles each model: its own step, so a slow compile
#    loses only itself)
step torch_compile 150 python3 bench/gpu.py --models resnet50,mobilenet_v2,resnet18 --precisions fp16 \
    --repeat 30 --torch --torch-compile --json "$W/gpu_torch_compile.json"
# 8. AMX on the host CPU (a Xeon with amx-int8; #52): ResNet-50 INT8 on tiles (x86-host) against VNNI
#    (x86-avx512) on two pinned cores, every output compared exactly (2026-11-29: bit-exact, 0.83x), then where
#    its time goes on the tiles
step amx_check 200 taskset -c 1,2 env TVM_NUM_THREADS=2 python3 bench/amx_check.py --models resnet50 --repeat 30
step amx_profile 120 taskset -c 1,2 env TVM_NUM_THREADS=2 python3 bench/profile.py resnet50 --target x86-host \
    --int8 minmax --runs 10 --top 20
# 9. where ResNet-50's and ResNet-18's fp16 time goes (graphs off, the device waited for around each call)
step profile_fp16 60 python3 bench/profile.py resnet50 --target cuda-sm90 --precision fp16 --runs 10 --top 20
step profile_fp16_resnet18 60 python3 bench/profile.py resnet18 --target cuda-sm90 --precision fp16 --runs 10 --top 12
# 10. why ResNet-50's fp16 3x3 convs at 14x14 and 7x7 run at 5-6 TFLOP/s (about 400 of its 700 us, docs/cuda.md):
#     Nsight Compute on one launch of each (occupancy, stall reasons, memory), the case for split-K across blocks
step ncu_convs 120 "$(command -v ncu || echo /usr/local/cuda/bin/ncu)" --kernel-name "regex:f59995|c72686" \
    --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis python3 bench/profile.py resnet50 --target cuda-sm90 --precision fp16 --runs 1
# 11. CUDA graphs on and off, whole models
step cuda_graph 70 python3 bench/cuda_graph.py --models mobilenet_v2,resnet50 --repeat 30
cat "$W/steps.txt"
