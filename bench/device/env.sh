# Sourced by every device step after stage2.sh: the TVM compiler from /root/tvmsite, tvmfuse from this checkout.
R=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PYTHONPATH=/root/tvmsite:$R PYTHONUNBUFFERED=1 TVM_NUM_THREADS=${TVM_NUM_THREADS:-2}
ln -sfn ../schedules "$R/tvmfuse/schedules"   # what the editable install's package-dir mapping does
cd "$R"
