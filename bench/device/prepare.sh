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
# Offline CUDA tuning (#51): the INT8 kernels of ResNet-50 and MobileNetV2 with every candidate tile, built here
# (about 9 minutes on 2 cores), then fp16 MobileNetV2's (ResNet-50's fp16 convs are shipped in tuning_logs/cuda-sm90
# since 2026-11-29),
# packed with xz (cubins compress 20x: 52 MB -> 3 MB for ResNet-50), carried by stage 1 and timed in the round;
# NO_CANDIDATES=1 leaves them out.
if [ -z "${NO_CANDIDATES:-}" ]; then
  T=$(mktemp -d) && rm -rf .candidates && mkdir -p .candidates
  for m in ${CANDIDATE_MODELS:-resnet50 mobilenet_v2}; do
    tvmfuse quantize zoo:$m --calib random:4 --method minmax --target cuda-sm90 --table "$T/$m.table.json" \
      -o "$T/$m.so" -q --no-cache > /dev/null
    tvmfuse tune zoo:$m --target cuda-sm90 --precision int8 --table "$T/$m.table.json" --export-candidates "$T/c" \
      | tail -n 1
  done
  # fp16 MobileNetV2 (about 5 minutes): its depthwise layers with one and two channels a thread (half2 reads of
  # an interleaved tile, the fp16 default since 2026-11-30, not yet timed) and its tensor-core tiles
  for m in ${FP16_CANDIDATE_MODELS:-mobilenet_v2}; do
    tvmfuse tune zoo:$m --target cuda-sm90 --precision fp16 --export-candidates "$T/c" | tail -n 1
  done
  tar -C "$T/c" -cf - . | xz -T0 -6 > .candidates/candidates.tar.xz && rm -rf "$T" && du -sh .candidates
fi
