#!/usr/bin/env bash
# Prepares, on a workstation that reaches Debian's registry and has the CUDA toolkit (nvcc), what bench/device/run.sh
# needs on a bare GPU machine that reaches no network, so its device minutes go to the GPU rather than to apt or the
# compiler:
#   .device-debs/   Debian's doctest-dev and nlohmann-json3-dev (apt-get download): run.sh unpacks them into a prefix
#                   when it has to build there;
#   .device-carry/  train_gpt2, the row kernels' and products' benches and the tests run.sh runs, built here for sm_90
#                   (Release, no io_uring, MPI or oneDNN: the machine lacks them), laid out as a build tree
#                   (examples/train_gpt2/, tests/, tests/cuda/), with
#                   the libraries they link that a CUDA image may lack (OpenBLAS, libgomp, libgfortran) in lib/.
# Both are ignored by git (.git/info/exclude); carry them:
#   run(command="bash bench/device/run.sh", carry=[".device-carry", ".device-debs"], timeout_s=540)
# A carried build that does not start there (other system libraries) is ignored and run.sh builds there instead.
# Usage: bash bench/device/prepare.sh [BUILD_DIR=build/carry]   (a first build takes 15-20 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build/carry}"
export PATH="/usr/local/cuda/bin:$PATH"
for ignored in .device-carry .device-debs; do
  grep -qxF "/$ignored/" .git/info/exclude 2>/dev/null || echo "/$ignored/" >> .git/info/exclude
done

rm -rf .device-debs && mkdir -p .device-debs
(cd .device-debs && apt-get download doctest-dev nlohmann-json3-dev)

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHUNKWISE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCHUNKWISE_BUILD_BENCH=OFF -DCHUNKWISE_MPI=OFF -DCHUNKWISE_URING=OFF -DCHUNKWISE_DNNL_LIBRARY=OFF > /dev/null
tests=$(ninja -C "$build" -t targets all | grep -o '^chunkwise_cuda_[a-z0-9_]*_test' | grep -v header_check | sort -u)
ninja -C "$build" train_gpt2 gpt2_row_kernels_bench gpt2_products_bench chunkwise_gpt2_device_test $tests

rm -rf .device-carry && mkdir -p .device-carry/examples/train_gpt2 .device-carry/tests/cuda .device-carry/lib
cp "$build/examples/train_gpt2/train_gpt2" "$build/examples/train_gpt2/gpt2_row_kernels_bench" \
  "$build/examples/train_gpt2/gpt2_products_bench" .device-carry/examples/train_gpt2/
cp "$build/tests/chunkwise_gpt2_device_test" .device-carry/tests/
for test in $tests; do cp "$build/tests/cuda/$test" .device-carry/tests/cuda/; done
# The libraries outside the C runtime and the CUDA toolkit (the image has both; NCCL comes from its PyTorch).
find .device-carry -type f -perm -u+x -exec ldd {} + | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|libcuda|libcublas|libnccl' |
  while read -r lib; do cp -L "$lib" .device-carry/lib/; done
bash bench/device/sources_fingerprint.sh > .device-carry/SOURCES  # run.sh uses the build for these sources only
du -sh .device-carry .device-debs
ls .device-carry/lib .device-debs
