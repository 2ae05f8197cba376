// nccl_comm on the one GPU of the test machine: a single-rank communicator, bootstrapped both ways (through a
// thread_comm and through a file), runs every collective on device buffers; with one rank each collective's result
// is known exactly (gather = copy, sum = average = the input).
#include "gpu_test_main.hpp"

#include <chunkwise/comm/cuda/nccl_comm.cuh>
#include <chunkwise/collective.hpp>
#include <chunkwise/comm/thread_comm.hpp>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

using namespace chunkwise;

static_assert(collective_strategy_for<sharded, nccl_comm> && collective_strategy_for<hybrid<2>, nccl_comm>);

namespace {

template <class T>
struct device_buffer {
  explicit device_buffer(std::size_t count) : count(count) { REQUIRE(cudaMalloc(&data, count * sizeof(T)) == cudaSuccess); }
  ~device_buffer() { cudaFree(data); }
  void upload(const std::vector<T>& values) {
    REQUIRE(cudaMemcpy(data, values.data(), count * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> values(count);
    REQUIRE(cudaMemcpy(values.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return values;
  }
  std::span<T> span() { return {data, count}; }
  std::span<const T> cspan() const { return {data, count}; }
  T* data = nullptr;
  std::size_t count;
};

template <class T>
std::vector<T> pattern(std::size_t count) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    const float value = static_cast<float>(static_cast<int>(i % 97) - 48) / 8.0f;  // exact in every dtype
    if constexpr (std::is_same_v<T, float>) values[i] = value;
    else if constexpr (std::is_same_v<T, bf16>) values[i] = to_bf16(value);
    else values[i] = to_fp16(value);
  }
  return values;
}

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void check_single_rank_collectives(nccl_comm& comm) {
  constexpr std::size_t count = 1 << 16;
  const auto values = pattern<T>(count);
  device_buffer<T> in(count), out(count);
  in.upload(values);
  comm.all_gather(in.cspan(), out.span()).wait();
  CHECK(same(out.download(), values));
  for (const reduce_op op : {reduce_op::sum, reduce_op::average}) {
    cudaMemset(out.data, 0, count * sizeof(T));
    comm.all_reduce(in.cspan(), out.span(), op).wait();
    CHECK(same(out.download(), values));
    cudaMemset(out.data, 0, count * sizeof(T));
    comm.reduce_scatter(in.cspan(), out.span(), op).wait();
    CHECK(same(out.download(), values));
  }
  comm.broadcast(out.span(), 0).wait();
  CHECK(same(out.download(), values));
  comm.barrier().wait();
}

}  // namespace

TEST_CASE_TEMPLATE("nccl_comm with one rank runs every collective on device buffers", T, float, bf16, fp16) {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  {
    thread_world world(1);
    auto bootstrap = world.comm(0);
    auto comm = make_nccl_comm(bootstrap, stream);
    CHECK(comm.rank() == 0);
    CHECK(comm.size() == 1);
    check_single_rank_collectives<T>(comm);
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("nccl_comm refuses a non-blocking stream, which nothing orders after the default stream's kernels") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  {
    thread_world world(1);
    auto bootstrap = world.comm(0);
    try {
      (void)make_nccl_comm(bootstrap, stream);
      FAIL("a cudaStreamNonBlocking stream must be refused");
    } catch (const chunkwise::error& e) {
      CHECK(e.code() == chunkwise::error_code::invalid_argument);
      CHECK(std::string(e.what()).find("cudaStreamNonBlocking") != std::string::npos);
    }
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("nccl_comm bootstraps through a file, groups several chunks and splits") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  {
    const auto path = std::filesystem::temp_directory_path() / ("chunkwise_nccl_id_" + std::to_string(::getpid()));
    auto comm = make_nccl_comm(path, 0, 1, stream);
    std::filesystem::remove(path);
    constexpr std::size_t chunks = 4, count = 4096;
    std::vector<std::unique_ptr<device_buffer<float>>> shards, fulls;
    std::vector<nccl_comm::request> requests;
    {
      auto group = comm.group();
      for (std::size_t c = 0; c < chunks; ++c) {
        shards.push_back(std::make_unique<device_buffer<float>>(count));
        fulls.push_back(std::make_unique<device_buffer<float>>(count));
        auto values = pattern<float>(count);
        values[0] = static_cast<float>(c);
        shards.back()->upload(values);
        requests.push_back(comm.all_gather(shards.back()->cspan(), fulls.back()->span()));
      }
      group.close();
    }
    for (auto& request : requests) request.wait();
    for (std::size_t c = 0; c < chunks; ++c) CHECK(fulls[c]->download()[0] == static_cast<float>(c));
    auto alone = comm.split(0, 0);
    CHECK(alone.size() == 1);
    check_single_rank_collectives<float>(alone);
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("nccl_comm groups nest, across communicators: their requests complete after the outermost close") {
  // NCCL launches a thread's grouped operations at its outermost ncclGroupEnd: an event recorded at an inner close
  // would complete before the collective ran.
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  {
    thread_world world(1);
    auto bootstrap = world.comm(0);
    auto comm = make_nccl_comm(bootstrap, stream);
    auto alone = comm.split(0, 0);
    constexpr std::size_t count = 1 << 16;
    const auto values = pattern<float>(count);
    device_buffer<float> in(count), out(count), out_alone(count);
    in.upload(values);
    std::vector<nccl_comm::request> requests;
    {
      auto outer = comm.group();
      requests.push_back(comm.all_gather(in.cspan(), out.span()));
      {
        auto inner = alone.group();
        requests.push_back(alone.all_gather(in.cspan(), out_alone.span()));
        inner.close();
      }
      // Not launched yet: a wait now would return at once on an unrecorded event.
      CHECK_THROWS_WITH_AS(requests[1].wait(), doctest::Contains("inside the group"), chunkwise::error);
      CHECK_THROWS_WITH_AS(requests[0].wait_on(stream), doctest::Contains("inside the group"), chunkwise::error);
      outer.close();
    }
    for (auto& request : requests) request.wait();
    CHECK(same(out.download(), values));
    CHECK(same(out_alone.download(), values));
  }
  cudaStreamDestroy(stream);
}
