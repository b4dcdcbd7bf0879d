set -e
S=/root/tvmsite
if [ ! -s $S/tvm/lib/libtvm_compiler.so ]; then
  mkdir -p $S
  tar -xJf .dev2/tvm_py.tar.xz -C $S
  cat /root/stash/compiler.xz.aa .dev2/compiler.xz.ab | xz -d > $S/tvm/lib/libtvm_compiler.so
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S .dev2/*.whl
fi
. bench/device/env.sh
python3 -c "import tvm, tvmfuse, xgboost; print('tvm', tvm.__version__, 'xgboost', xgboost.__version__); from tvmfuse import cuda_driver, targets; print('avx512 runs:', targets.resolve('x86-avx512').backend().runs_on_this_cpu(), 'cuda:', cuda_driver.cuda_available())"
