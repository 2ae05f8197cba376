// The README's table "Bad input and what it produces", row by row: each case feeds the bad input to the public API
// and asserts the error code and the key words of the message the table promises, so the README and the code
// cannot drift apart. The part tests check the same errors in more detail; this file is the one place that mirrors
// the table, in its order. Keep the two in sync: a new row here is a new row there.
#include <chunkwise/collective.hpp>
#include <chunkwise/comm/thread_comm.hpp>
#include <chunkwise/core.hpp>
#include <chunkwise/layout.hpp>
#include <chunkwise/optim/state_io.hpp>
#include <chunkwise/placement/device_cache.hpp>
#include <chunkwise/plan/dispatch.hpp>
#include <chunkwise/plan/search.hpp>
#include <chunkwise/profile.hpp>
#include <chunkwise/placement/resident.hpp>
#include <chunkwise/runtime/runtime.hpp>
#include <chunkwise/tier.hpp>
#include <chunkwise/backend/host.hpp>

#include <doctest/doctest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tier_test_support.hpp"

using namespace chunkwise;
using namespace std::chrono_literals;
using chunkwise::test::temp_dir;

namespace {

/// What `f` threw: its code and message. Fails the test when it throws nothing or something else.
struct thrown {
  error_code code = error_code::unsupported;
  std::string message;
  /// The ones of `words` that the message lacks, one per line: empty when it says them all. As a string, so a
  /// failing CHECK(t.lacks(...) == "") prints what is missing.
  [[nodiscard]] std::string lacks(std::initializer_list<std::string_view> words) const {
    std::string missing;
    for (const auto word : words)
      if (message.find(word) == std::string::npos) (missing += word) += '\n';
    return missing;
  }
};

thrown error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const error& e) {
    return {e.code(), e.what()};
  }
  FAIL("no chunkwise::error was thrown");
  return {};
}

/// Asserts `f` throws `code` with every one of `words` in its message.
void check_error(const std::function<void()>& f, error_code code, std::initializer_list<std::string_view> words) {
  const thrown t = error_of(f);
  CAPTURE(t.message);
  CHECK(to_string(t.code) == to_string(code));
  CHECK(t.lacks(words) == "");
}

model_profile tiny_model() {
  model_profile m;
  m.name = "tiny";
  m.tensors = {{"a", 10}, {"b", 20, dtype::bf16}, {"c", 30, dtype::fp16}};
  m.passes = {{"l0", pass_kind::forward, {0, 1}, 100}, {"l1", pass_kind::forward, {2}, 200},
              {"l1", pass_kind::backward, {2, 0}, 300}};
  return m;
}

std::filesystem::path write_text(const std::filesystem::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary) << text;
  return file;
}

// ---- a small model for the runtime: fp32 tensors, forward then backward ----
model_profile runtime_model(const char* name = "two-layer") {
  model_profile m;
  m.name = name;
  m.tensors = {{"w0", 3000}, {"w1", 5000}};
  m.passes = {{"l0", pass_kind::forward, {0}, 0}, {"l1", pass_kind::forward, {1}, 0},
              {"l1", pass_kind::backward, {1}, 0}, {"l0", pass_kind::backward, {0}, 0}};
  return m;
}

using replicated_plan = plan<layout::per_tensor, resident, replicated, optimizer_follows_home>;
using zero2_plan = plan<layout::per_tensor, resident, shard_grads, optimizer_follows_home>;
using runtime_plans = plan_set<replicated_plan, zero2_plan>;

struct run_options {
  model_profile model = runtime_model();
  runtime_options runtime{};
  std::string save_to{};
  std::string load_from{};
};

/// One training iteration on `ranks` thread ranks, rank r under plan_of(r) (an index into runtime_plans): every pass
/// in backward adds 1 to the gradients of the tensors it touches. Returns each rank's error, or null.
std::vector<std::exception_ptr> train(int ranks, const run_options& run, const std::function<std::size_t(int)>& plan_of) {
  thread_world world(ranks, 5000ms);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = world.comm(r);
        dispatch<runtime_plans>(plan_of(r), [&]<class Plan>(std::type_identity<Plan>) {
          runtime<Plan, host_backend, thread_comm> rt(run.model, comm, [](std::uint32_t, std::span<float> v) {
            std::fill(v.begin(), v.end(), 0.5f);
          }, run.runtime);
          if (!run.load_from.empty()) rt.load_checkpoint(run.load_from);
          rt.zero_grad();
          for (std::size_t i = 0; i < run.model.passes.size(); ++i) {
            rt.acquire(i);
            if (run.model.passes[i].kind == pass_kind::backward)
              for (const auto t : run.model.passes[i].tensors)
                for (float& g : rt.gradient(t)) g += 1.0f;
            rt.release(i);
          }
          rt.step(1e-3f);
          if (!run.save_to.empty()) rt.save_checkpoint(run.save_to);
        });
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

thrown error_of(const std::exception_ptr& e) {
  return error_of([&] {
    if (e) std::rethrow_exception(e);
  });
}

}  // namespace

TEST_CASE("a model profile with no tensors") {
  model_profile empty;
  empty.name = "X";
  check_error([&] { validate(empty); }, error_code::invalid_profile,
              {"model profile 'X': has no tensors; register at least one tensor"});
}

TEST_CASE("a tensor with zero elements") {
  auto model = tiny_model();
  model.tensors[1].elements = 0;
  check_error([&] { validate(model); }, error_code::invalid_profile, {"tensor #1 'b' has zero elements"});
}

TEST_CASE("a pass that names a tensor that does not exist") {
  auto model = tiny_model();
  model.passes[1].tensors.push_back(7);
  check_error([&] { validate(model); }, error_code::invalid_profile,
              {"pass #1", "touches tensor #7", "the profile has 3 tensors"});
  auto document = to_json(tiny_model());
  document["passes"][2]["tensors"][1] = 9;
  check_error([&] { (void)model_profile_from_json(document, "p.json"); }, error_code::parse_error,
              {"p.json.passes[2].tensors[1]", "tensor index 9 is out of range", "the profile has 3 tensors"});
}

TEST_CASE("tensors not in first-use order") {
  auto model = tiny_model();
  model.passes[0].tensors = {0, 2};
  model.passes[1].tensors = {1};
  check_error([&] { validate(model); }, error_code::invalid_profile,
              {"tensor #2 'c' is first used (pass #0) before tensor #1 'b'", "sort_by_first_use"});
  CHECK_NOTHROW(validate(sort_by_first_use(model)));
}

TEST_CASE("a JSON profile missing a field or with a wrong type") {
  auto document = to_json(tiny_model());
  document["tensors"][1].erase("elements");
  check_error([&] { (void)model_profile_from_json(document, "p.json"); }, error_code::parse_error,
              {"p.json.tensors[1].elements: missing field"});
  document = to_json(tiny_model());
  document["tensors"][0]["elements"] = "ten";
  check_error([&] { (void)model_profile_from_json(document, "p.json"); }, error_code::parse_error,
              {"p.json.tensors[0].elements: expected an unsigned integer, found string"});
}

TEST_CASE("a file that is not JSON") {
  temp_dir dir;
  const auto file = write_text(dir.path() / "f.json", "{ \"format\": ");
  check_error([&] { (void)load_model_profile(file); }, error_code::parse_error, {"f.json' is not valid JSON: "});
  check_error([&] { (void)load_machine_profile(file); }, error_code::parse_error, {"f.json' is not valid JSON: "});
}

TEST_CASE("a tensor larger than a fixed<> chunk") {
  auto model = tiny_model();
  model.tensors[2].elements = 3000;  // 6000 bytes of fp16
  check_error([&] { (void)layout::fixed<4 * KiB>::build(model, {}); }, error_code::layout_error,
              {"tensor 'c' needs 5.86 KiB (6000 bytes) but chunks hold 4.00 KiB",
               "use a chunk size of at least 5.86 KiB"});
}

TEST_CASE("ranks = 0, an alignment that is not a power of two") {
  const auto model = tiny_model();
  check_error([&] { (void)layout::per_tensor::build(model, {.ranks = 0}); }, error_code::invalid_argument,
              {"ranks is 0; a layout needs at least one rank"});
  check_error([&] { (void)layout::min_waste<>::build(model, {.ranks = 2, .alignment = 100}); },
              error_code::invalid_argument, {"alignment 100 is not a power of two; use 256"});
}

TEST_CASE("an unknown model name") {
  check_error([&] { (void)find_gpt2_config("gpt5"); }, error_code::invalid_argument,
              {"unknown model 'gpt5'; known models: gpt2-124m, gpt2-355m"});
}

TEST_CASE("a byte size such as '12 parsecs'") {
  check_error([&] { (void)parse_bytes("12 parsecs"); }, error_code::invalid_argument,
              {"'12 parsecs' is not a byte size; write", "512MiB, 24GiB or 3GB"});
}

TEST_CASE("a machine whose memory no plan fits in") {
  const auto model = gpt2_profile(gpt2_774m);
  const auto machine = describe_machine({.gpus = 1, .gpu_memory = 3 * GiB, .host_memory = 64 * GiB});
  const thrown t = error_of([&] { (void)choose<runtime_plans>(model, machine); });
  CAPTURE(t.message);
  CHECK(t.code == error_code::out_of_memory);
  CHECK(t.lacks({"no plan fits this machine (1 x 3.00 GiB device memory", "The closest is ",
                "of device memory, the machine has 3.00 GiB.", "Per plan:"}) == "");
  for (const auto& name : runtime_plans::names()) CHECK(t.lacks({"\n  " + name + ": needs "}) == "");
}

TEST_CASE("a machine profile with 0 devices, no collective bandwidth for several devices, a negative latency") {
  const auto good = describe_machine({.gpus = 4});
  CHECK_NOTHROW(validate(good));
  auto machine = good;
  machine.devices = 0;
  check_error([&] { validate(machine); }, error_code::invalid_profile, {"machine profile 'described': devices is 0"});
  machine = good;
  machine.all_reduce = {};
  check_error([&] { validate(machine); }, error_code::invalid_profile,
              {"several devices need all_gather, reduce_scatter and all_reduce bandwidths"});
  // A negative latency was accepted, from code and from JSON alike (loading validates): it makes more, smaller
  // collectives look cheaper than fewer large ones.
  machine = good;
  machine.collective_latency_seconds = -1e-5;
  check_error([&] { validate(machine); }, error_code::invalid_profile, {"collective_latency_seconds must be 0 or more"});
  auto document = to_json(good);
  document["collective_latency_seconds"] = -1e-5;
  check_error([&] { (void)machine_profile_from_json(document, "m.json"); }, error_code::invalid_profile,
              {"collective_latency_seconds"});
  machine.collective_latency_seconds = std::numeric_limits<double>::quiet_NaN();
  check_error([&] { validate(machine); }, error_code::invalid_profile, {"collective_latency_seconds"});
  machine.collective_latency_seconds = 0;  // free collectives are a legal idealisation
  CHECK_NOTHROW(validate(machine));
}

TEST_CASE("--plan/find_plan with an unknown name, dispatch with an index out of range") {
  const thrown t = error_of([&] { (void)find_plan<runtime_plans>("zero-4"); });
  CHECK(t.code == error_code::invalid_argument);
  CHECK(t.lacks({"unknown plan 'zero-4'; the plans are:"}) == "");
  for (const auto& name : runtime_plans::names()) CHECK(t.lacks({"\n  " + name}) == "");
  check_error([&] { (void)dispatch<runtime_plans>(2, [](auto) { return 0; }); }, error_code::invalid_argument,
              {"plan index 2 is out of range; the plan set has 2 plans"});
}

TEST_CASE("a tier allocation over its byte budget") {
  emulated_device_tier device(10 * MiB);
  void* first = device.allocate_sync(6 * MiB, 0);
  check_error([&] { (void)device.allocate_sync(5 * MiB, 0); }, error_code::out_of_memory,
              {"cannot allocate 5.00 MiB (5242880 bytes)", "6.00 MiB (6291456 bytes) in use",
               "10.00 MiB (10485760 bytes) budget", "4.00 MiB free"});
  device.deallocate_sync(first, 6 * MiB, 0);
  CHECK(device.stats().in_use == 0);
}

TEST_CASE("a budget smaller than one chunk") {
  constexpr byte_count chunk = 64 * KiB;
  SUBCASE("device cache: its device tier cannot hold one block") {
    host_backend backend;
    pinned_host_tier home(2 * chunk);
    emulated_device_tier device(chunk - 1);
    transfer_engine<host_backend, pinned_host_tier> engine(backend, home);
    std::vector<void*> homes{home.allocate_sync(chunk, 0), home.allocate_sync(chunk, 0)};
    using cache_type = device_cache<transfer_engine<host_backend, pinned_host_tier>, emulated_device_tier>;
    check_error([&] { cache_type cache(engine, device, homes, {0, 1}, {.blocks = 1, .chunk_bytes = chunk}); },
                error_code::out_of_memory,
                {"cannot allocate 64.00 KiB (65536 bytes)", "(65535 bytes) budget"});
    CHECK(device.stats().in_use == 0);
    for (void* h : homes) home.deallocate_sync(h, chunk, 0);
  }
  SUBCASE("NVMe store: a capacity that holds no block") {
    temp_dir dir;
    nvme_options options;
    options.directory = dir.path();
    options.block_bytes = chunk;
    options.capacity = chunk - 1;
    check_error([&] { nvme_tier store(options); }, error_code::invalid_argument,
                {"capacity of 64.00 KiB (65535 bytes) holds no block of 64.00 KiB"});
  }
  SUBCASE("runtime: a device budget below one chunk fails at construction") {
    run_options run;
    run.runtime.device_budget = 4 * KiB;  // the smaller tensor alone is 11.72 KiB
    const auto errors = train(1, run, [](int) { return 0; });
    const thrown t = error_of(errors[0]);
    CAPTURE(t.message);
    CHECK(t.code == error_code::out_of_memory);
    CHECK(t.lacks({"device (host backend) tier: cannot allocate", "4.00 KiB (4096 bytes) budget"}) == "");
  }
}

TEST_CASE("an NVMe store in a missing directory, larger than the free space or than RLIMIT_FSIZE") {
  temp_dir dir;
  nvme_options options;
  options.directory = dir.path() / "no" / "such" / "dir";
  options.block_bytes = 64 * KiB;
  options.capacity = 4 * 64 * KiB;
  check_error([&] { nvme_tier store(options); }, error_code::io_error,
              {"store directory '" + options.directory.string() + "' does not exist",
               "create it or point the store elsewhere"});
  options.directory = dir.path();
  options.capacity = 64 * TiB;
  check_error([&] { nvme_tier store(options); }, error_code::io_error,
              {"no space: the store needs 64.00 TiB", "'" + dir.path().string() + "' has "});
  // The file size limit is checked before the file exists, so lowering it here cannot raise SIGXFSZ; restored after.
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  rlimit lower = saved;
  lower.rlim_cur = 128 * KiB;
  if (saved.rlim_max == RLIM_INFINITY || saved.rlim_max >= lower.rlim_cur) {
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lower) == 0);
    options.capacity = 4 * 64 * KiB;
    const thrown t = error_of([&] { nvme_tier store(options); });
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &saved) == 0);
    CAPTURE(t.message);
    CHECK(t.code == error_code::io_error);
    CHECK(t.lacks({"the store needs a file of 256.00 KiB (262144 bytes)", "RLIMIT_FSIZE of 128.00 KiB"}) == "");
  }
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("a block corrupted on disk") {
  temp_dir dir;
  nvme_options options;
  options.directory = dir.path();
  options.block_bytes = 64 * KiB;
  options.capacity = 2 * 64 * KiB;
  options.io_bytes = 16 * KiB;
  options.path = nvme_io_path::threads;
  nvme_tier store(options);
  pinned_host_tier pinned(64 * KiB);
  auto* buffer = static_cast<unsigned char*>(pinned.allocate_sync(64 * KiB, 4096));
  const nvme_block block = store.allocate_sync(64 * KiB);
  chunkwise::test::fill_random(buffer, 64 * KiB, 3);
  store.write(block, buffer, 64 * KiB);
  {  // flip one byte of the block's second request behind the store's back
    std::fstream file(store.file(), std::ios::in | std::ios::out | std::ios::binary);
    const auto offset = static_cast<std::streamoff>(store.file_offset(block) + 16 * KiB + 7);
    file.seekg(offset);
    const char byte = static_cast<char>(file.get() ^ 0x01);
    file.seekp(offset);
    file.put(byte);
  }
  std::fill_n(buffer, 64 * KiB, 0);
  check_error([&] { store.read(block, buffer, 64 * KiB); }, error_code::io_error,
              {"checksum mismatch in block " + std::to_string(block.slot) + " request 1", "is corrupted"});
  store.deallocate_sync(block);
  pinned.deallocate_sync(buffer, 64 * KiB, 4096);
}

TEST_CASE("a rank that never arrives at a collective") {
  thread_world world(3, 100ms);
  std::vector<std::string> messages(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)  // rank 2 never calls
    ranks.emplace_back([&, r] {
      auto comm = world.comm(r);
      float value = 1;
      try {
        comm.all_reduce(std::span<const float>(&value, 1), std::span<float>(&value, 1), reduce_op::sum).wait();
      } catch (const error& e) {
        messages[static_cast<std::size_t>(r)] = e.what();
        CHECK(e.code() == error_code::comm_error);
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& message : messages) {
    CAPTURE(message);
    CHECK(message.find("waited 100 ms in all_reduce #1") != std::string::npos);
    CHECK(message.find("for rank 2, which has not arrived") != std::string::npos);
  }
}

TEST_CASE("ranks that disagree on the plan") {
  // The runtime compares a fingerprint of plan, model and layout knobs across ranks before any collective of the
  // plan: every rank fails at construction with what it runs (on any communicator, not only thread_comm's checks).
  const auto errors = train(2, {}, [](int rank) { return rank == 0 ? std::size_t{0} : std::size_t{1}; });
  for (std::size_t r = 0; r < errors.size(); ++r) {
    const thrown t = error_of(errors[r]);
    CAPTURE(t.message);
    CHECK(t.code == error_code::invalid_argument);
    CHECK(t.lacks({"the ranks disagree on the plan: rank 1 differs from rank 0",
                   "this is rank " + std::to_string(r) + ", running " +
                       (r == 0 ? replicated_plan::name() : zero2_plan::name())}) == "");
  }
  // The same plan with different knobs is a disagreement too.
  thread_world world(2, 5000ms);
  std::vector<std::exception_ptr> knob_errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = world.comm(r);
        runtime<zero2_plan, host_backend, thread_comm> rt(runtime_model(), comm, [](std::uint32_t, std::span<float>) {},
                                            {.alignment = r == 0 ? 256u : 512u});
      } catch (...) {
        knob_errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : knob_errors) CHECK(error_of(e).lacks({"disagree on the plan"}) == "");
}

TEST_CASE("an optimizer state file that is truncated, corrupted or of another kind") {
  std::vector<float> master(100, 1.0f), m1(100, 0.5f), m2(100, 0.25f);
  const optim::chunk_arrays chunk{master.data(), nullptr, dtype::fp32, m1.data(), m2.data(), nullptr, dtype::bf16, 100};
  std::stringstream saved;
  optim::save_state(saved, chunk, optim::optimizer_kind::adam, 5);
  const std::string bytes = saved.str();
  const auto load = [&](const std::string& text, optim::optimizer_kind kind = optim::optimizer_kind::adam) {
    return [=] {
      std::istringstream in(text);
      (void)optim::load_state(in, chunk, kind);
    };
  };
  check_error(load(bytes.substr(0, bytes.size() - 8)), error_code::parse_error, {"load_state: the input is truncated"});
  std::string corrupted = bytes;
  corrupted[200] ^= 0x04;
  check_error(load(corrupted), error_code::parse_error, {"load_state: checksum mismatch", "the file is corrupt"});
  check_error(load(bytes, optim::optimizer_kind::sgd_momentum), error_code::parse_error,
              {"the file holds optimizer kind", "the chunk expects sgd_momentum"});
  const std::string version_1 = std::string("CWOPTST\0\x01\0\0\0", 12) + bytes.substr(12);  // the format before 3
  check_error(load(version_1), error_code::parse_error,
              {"load_state: it is in format version 1", "this build reads format version 3 only"});
  temp_dir dir;
  check_error([&] { (void)optim::load_state(dir.path() / "missing.bin", chunk, optim::optimizer_kind::adam); },
              error_code::io_error, {"load_state: cannot open", "missing.bin"});
}

TEST_CASE("a runtime checkpoint that is corrupted or truncated") {
  temp_dir dir;
  const auto zero2 = [](int) { return std::size_t{1}; };
  for (const auto& e : train(2, {.save_to = dir.path().string()}, zero2)) CHECK_FALSE(e);
  const auto commit = read_checkpoint_commit(dir.path());
  const auto file = checkpoint_rank_file(commit.step_directory, 1, commit.ranks);
  const std::string good = read_file(file);
  std::string header_flipped = good, data_flipped = good;
  header_flipped[12] = static_cast<char>(header_flipped[12] ^ 0x40);
  data_flipped[data_flipped.size() - 4] = static_cast<char>(data_flipped[data_flipped.size() - 4] ^ 0x40);
  for (const auto& damaged : {good.substr(0, good.size() / 2), header_flipped, data_flipped}) {
    write_file_atomically(file, damaged);
    const auto errors = train(2, {.load_from = dir.path().string()}, zero2);
    // Every rank reads every rank file's header (any of them may hold its pieces): each says what is wrong.
    for (const auto& e : errors) {
      const thrown t = error_of(e);
      CAPTURE(t.message);
      CHECK(t.code == error_code::parse_error);
      CHECK(t.lacks({"checkpoint '" + file.string() + "' is corrupted or truncated"}) == "");
    }
  }
  write_file_atomically(file, "CHKWCK02" + good.substr(8));  // a rank file of the runtime's format before 3
  for (const auto& e : train(2, {.load_from = dir.path().string()}, zero2))
    check_error([&] { std::rethrow_exception(e); }, error_code::parse_error,
                {"checkpoint '" + file.string() + "': it is in format version 2", "this build reads format version 3 only"});
  std::filesystem::remove(file);
  for (const auto& e : train(2, {.load_from = dir.path().string()}, zero2))
    check_error([&] { std::rethrow_exception(e); }, error_code::io_error,
                {"rank-1-of-2.chunkwise' is missing; LATEST names 2 rank files"});
  std::filesystem::remove(dir.path() / "LATEST");
  for (const auto& e : train(2, {.load_from = dir.path().string()}, zero2))
    check_error([&] { std::rethrow_exception(e); }, error_code::io_error, {"no LATEST file in"});
}

TEST_CASE("a checkpoint of another model; another plan or rank count reshards") {
  temp_dir dir;
  const auto zero2 = [](int) { return std::size_t{1}; };
  for (const auto& e : train(2, {.save_to = dir.path().string()}, zero2)) CHECK_FALSE(e);
  SUBCASE("another rank count and another plan: loaded") {
    for (const auto& e : train(1, {.load_from = dir.path().string()}, zero2)) CHECK_FALSE(e);
    for (const auto& e : train(2, {.load_from = dir.path().string()}, [](int) { return std::size_t{0}; }))
      CHECK_FALSE(e);
  }
  SUBCASE("another model of the same sizes") {
    const auto errors = train(2, {.model = runtime_model("renamed"), .load_from = dir.path().string()}, zero2);
    for (const auto& e : errors)
      check_error([&] { std::rethrow_exception(e); }, error_code::invalid_argument,
                  {"was saved for another model ('two-layer'; this run trains 'renamed'"});
  }
}

TEST_CASE("a JSON number beyond double's range, tensors whose bytes overflow 64 bits, knobs that wrap") {
  temp_dir dir;
  const auto huge = write_text(dir.path() / "huge.json", R"({"format": "chunkwise.model_profile", "version": 1e400})");
  check_error([&] { (void)load_model_profile(huge); }, error_code::parse_error, {"huge.json' is not valid JSON"});
  auto wraps = tiny_model();
  wraps.tensors[1].elements = (std::uint64_t{1} << 63) + 1;  // * 2 bytes wraps to 2
  check_error([&] { validate(wraps); }, error_code::invalid_profile,
              {"tensor #1 'b' has 9223372036854775809 elements of 2 bytes", "at most 64.00 PiB"});
  const auto model = tiny_model();
  check_error([&] { (void)layout::min_waste_range(model, {}, ~byte_count{0}, 0, 0); }, error_code::invalid_argument,
              {"must each be at most 64.00 PiB"});
  check_error([&] { (void)layout::per_tensor::build(model, {.ranks = 3, .alignment = byte_count{1} << 63}); },
              error_code::invalid_argument, {"exceeds the 1 TiB limit on the chunk granule"});
}
