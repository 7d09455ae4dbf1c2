#!/bin/sh
# The core's GPU checks on a machine with a GPU, NCCL and a CUDA runtime
# (the device machine's image, or any with tensorflow[and-cuda] installed):
# finds libnccl.so.2 and libcudart.so where pip or CUDA put them unless
# TNT_NCCL_LIBRARY / TNT_CUDART_LIBRARY say, builds the C tests, and runs the
# stand-in tests (test_nccl) and the real ones (test_nccl_gpu, and host
# staging's test_gpu_staging on 1 and 2 ranks sharing the GPU, timing a 100 MB
# bucket beside bench/gpu_copy_bandwidth.c's bound; then its threads and
# failed-call cases).
#   sh core/test/run_on_gpu.sh [LOG_DIR]
set -u
cd "$(dirname "$0")/.."
log=${1:-/tmp}
find_lib() { # the first $1 under the usual roots (pip's site-packages, CUDA's lib64)
  find /opt /usr /root/.local "$HOME" -name "$1" 2>/dev/null | head -n 1
}
: "${TNT_NCCL_LIBRARY:=$(find_lib 'libnccl.so.2')}"
: "${TNT_CUDART_LIBRARY:=$(find_lib 'libcudart.so.13')}"
[ -n "$TNT_CUDART_LIBRARY" ] || TNT_CUDART_LIBRARY=$(find_lib 'libcudart.so.12')
export TNT_NCCL_LIBRARY TNT_CUDART_LIBRARY
echo "NCCL: $TNT_NCCL_LIBRARY"
echo "CUDA runtime: $TNT_CUDART_LIBRARY"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 4
status=0
if command -v make >/dev/null; then
  make -s -j8 build/test_nccl build/test_nccl_gpu build/test_gpu_staging >"$log/build.log" 2>&1 ||
    { cat "$log/build.log"; exit 1; }
  make -s run-test_nccl >"$log/test_nccl.log" 2>&1 || status=1
  tail -n 1 "$log/test_nccl.log"
else # no make: the GPU program alone, as the Makefile builds it
  mkdir -p build
  for t in test_nccl_gpu test_gpu_staging; do
    ${CC:-cc} -std=gnu11 -O2 -Iinclude -Isrc -o build/$t test/$t.c test/sanitizer_options.c \
      $(find src -name '*.c' -not -path 'src/transport/plugins/*') -lpthread -lrt -lm -ldl >"$log/build.log" 2>&1 ||
      { cat "$log/build.log"; exit 1; }
  done
fi
NCCL_DEBUG=${NCCL_DEBUG:-WARN} ./build/test_nccl_gpu >"$log/test_nccl_gpu.log" 2>&1 || status=1
cat "$log/test_nccl_gpu.log"
for n in 1 2; do
  ./build/test_gpu_staging $n --bench >"$log/test_gpu_staging$n.log" 2>&1 || status=1
  cat "$log/test_gpu_staging$n.log"
done
# two threads per rank staging at once, and a call that fails part-way, on the GPU's own streams
for args in "2 --threads" "4 --threads" "2 --failed"; do
  ./build/test_gpu_staging $args >"$log/test_gpu_staging_more.log" 2>&1 || status=1
  echo "test_gpu_staging $args: $(tail -n 1 "$log/test_gpu_staging_more.log")"
done
${CC:-cc} -O2 -o build/gpu_copy_bandwidth ../bench/gpu_copy_bandwidth.c -ldl && ./build/gpu_copy_bandwidth
exit $status
