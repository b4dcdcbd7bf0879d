# One device call (after stage1.sh and stage2.sh, on the same warm machine): tune the zoo models for
# x86-avx512 into tuning_logs/ and copy the folder to $OUT as each model finishes.
#   run(carry=[], command="bash bench/device/tune_avx512.sh 32 520")
# $1: trials per kernel (default 32); $2: seconds for the whole call (default 520: with the 40 s kill grace
# it stays inside the 600 s limit).
# A model cut off by the time limit keeps its staged records: the next call resumes it (--resume).
set -u
. bench/device/env.sh
TRIALS=${1:-32}; BUDGET=${2:-520}; END=$(( $(date +%s) + BUDGET ))
mkdir -p "$OUT/x86-avx512"
for m in mobilenet_v2 efficientnet_lite0 resnet50; do
  LEFT=$(( END - $(date +%s) ))
  [ "$LEFT" -gt 30 ] || { echo "[device] no time left for $m"; break; }
  echo "[device] $m: $LEFT s left"
  timeout -s INT -k 40 "$LEFT" python3 -m tvmfuse tune "zoo:$m" --target x86-avx512 --trials "$TRIALS" \
    --logs tuning_logs --resume 2>&1 | tail -n 40
  cp tuning_logs/x86-avx512/*.json "$OUT/x86-avx512/"
  # Unfinished runs too, so a fresh machine can resume them.
  [ -d tuning_logs/x86-avx512/.runs ] && cp -r tuning_logs/x86-avx512/.runs "$OUT/x86-avx512/"
done
ls -la "$OUT/x86-avx512"
