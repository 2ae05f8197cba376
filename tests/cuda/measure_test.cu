// measure<cuda_backend>() on a GPU: a valid profile with plausible numbers. Compiled and linked everywhere the
// toolkit is; runs where a GPU is.
#include "gpu_test_main.hpp"

#include <chunkwise/measure/cuda/measure.cuh>

using namespace chunkwise;

TEST_CASE("measuring the GPUs gives a valid profile") {
  measure_options options{.nvme_test_bytes = 64 * MiB, .ranks = 8};
  const auto m = measure<cuda_backend>(options);
  CHECK_NOTHROW(validate(m));
  CHECK(m.kind == device_kind::cuda);
  CHECK(m.devices >= 1);
  CHECK(m.device_memory > 1 * GiB);
  CHECK(m.host_to_device_bytes_per_second > 1e9);
  CHECK(m.device_flops_per_second > 1e12);
  CHECK(m.device_optimizer_params_per_second > m.host_optimizer_params_per_second);
}
