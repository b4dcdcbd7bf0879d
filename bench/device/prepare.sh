#!/usr/bin/env bash
# Here (the build machine): pack the full TVM compiler for a lent GPU machine (Python 3.12, no TVM, 64 MiB per
# call). libtvm_compiler.so is 250 MB, 59 MB as xz: it travels in two halves, .dev1/ then .dev2/.
set -euo pipefail
cd "$(dirname "$0")/../.."
SP=$(python -c "import tvm, os; print(os.path.dirname(os.path.dirname(tvm.__file__)))")
FFI=$(python -c "import tvm_ffi; print(tvm_ffi.__version__)")
XGB=$(python -c "import xgboost; print(xgboost.__version__)")
TOR=$(python -c "import tornado; print(tornado.version)")
mkdir -p .dev1 .dev2 .git/info && grep -qx "/.dev1/" .git/info/exclude || printf '/.dev1/\n/.dev2/\n' >> .git/info/exclude
xz -T0 -6 -c "$SP/tvm/lib/libtvm_compiler.so" | split -b 31000000 - /tmp/compiler.xz.
mv /tmp/compiler.xz.aa .dev1/ && mv /tmp/compiler.xz.ab .dev2/
tar -C "$SP" --exclude=libtvm_compiler.so --exclude=__pycache__ --exclude=tvm/3rdparty --exclude=tvm/src \
    -cJf .dev2/tvm_py.tar.xz tvm
for w in apache-tvm-ffi==$FFI xgboost-cpu==$XGB tornado==$TOR; do
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .dev2 "$w"
done
du -sh .dev1 .dev2
# The round's fuzz slice: random CNNs built for CUDA here (about 3 minutes), carried by stage 1.
rm -rf .fuzz && python bench/device/fuzz_slice.py prepare .fuzz --seeds 0-29 && du -sh .fuzz
# Offline CUDA tuning (#51): the kernels of the zoo models below with every candidate tile, built here, packed with xz
# (cubins compress 20x), carried by stage 1 and timed in the round; NO_CANDIDATES=1 leaves them out. Shipped in
# tuning_logs/cuda-sm90 already: ResNet-50 fp16 (2026-11-29), ResNet-50 and MobileNetV2 INT8 and MobileNetV2 fp16
# (2026-11-30). Since then: fp16 ResNet-18 (2.3x torch.compile on 2026-11-30) and EfficientNet-Lite0 (about 8
# minutes), and FP32 MobileNetV2 (whether FP32's depthwise tiles want strips of 2 as fp16's and INT8's did) and
# ResNet-18 (1.43x PyTorch eager's FP32 on 2026-11-30: its CUDA-core GEMM tiles). CANDIDATE_MODELS (INT8, quantized
# on random:4 here), FP16_CANDIDATE_MODELS and FP32_CANDIDATE_MODELS choose.
if [ -z "${NO_CANDIDATES:-}" ]; then
  T=$(mktemp -d) && rm -rf .candidates && mkdir -p .candidates "$T/c"
  for m in ${CANDIDATE_MODELS:-}; do
    tvmfuse quantize zoo:$m --calib random:4 --method minmax --target cuda-sm90 --table "$T/$m.table.json" \
      -o "$T/$m.so" -q --no-cache > /dev/null
    tvmfuse tune zoo:$m --target cuda-sm90 --precision int8 --table "$T/$m.table.json" --export-candidates "$T/c" \
      | tail -n 1
  done
  for p in fp16 fp32; do
    if [ $p = fp16 ]; then models=${FP16_CANDIDATE_MODELS:-resnet18 efficientnet_lite0}
    else models=${FP32_CANDIDATE_MODELS:-mobilenet_v2 resnet18}; fi
    for m in $models; do
      tvmfuse tune zoo:$m --target cuda-sm90 --precision $p --export-candidates "$T/c" | tail -n 1
    done
  done
  tar -C "$T/c" -cf - . | xz -T0 -6 > .candidates/candidates.tar.xz && rm -rf "$T" && du -sh .candidates
fi
