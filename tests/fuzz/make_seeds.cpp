// Writes the seed corpus under tests/fuzz/corpus/ from the library itself:
//   clang++ -std=c++20 -Iinclude tests/fuzz/make_seeds.cpp -o /tmp/make_seeds && /tmp/make_seeds tests/fuzz/corpus
// Model seeds: GPT-2 124M, a small hand-made profile (defaults omitted, tied tensor, two passes) and the same small
// profile with its passes under "steps", the key of files written before the rename (the loader still reads it).
// Machine seeds: described machines and a host machine with multi-point collective curves.
// Layout seeds: fixed pseudo-random byte strings (the layout target reads any bytes as a tensor list).
// The regress_* seeds are not written here: they are inputs that found bugs, kept so every run replays them.
#include <chunkwise/profile/gpt2.hpp>
#include <chunkwise/profile/json.hpp>
#include <chunkwise/profile/machine_json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace {

void write(const std::filesystem::path& file, const std::string& bytes) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << bytes;
  std::printf("%s (%zu bytes)\n", file.c_str(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace chunkwise;
  const std::filesystem::path root = argc > 1 ? argv[1] : "tests/fuzz/corpus";

  write(root / "fuzz_model_profile" / "gpt2_124m.json", to_json(gpt2_profile(gpt2_124m)).dump());
  const auto small = [](const char* passes_key) {
    return std::string(R"({"format":"chunkwise.model_profile","version":1,"name":"small",
"tensors":[{"name":"wte","elements":4096,"dtype":"bf16","tied":true},{"name":"w","elements":300,"dtype":"fp32"},
{"name":"m","elements":300,"dtype":"fp32","role":"optimizer_state"},{"name":"g","elements":7,"dtype":"fp16","role":"gradient"}],
")") + passes_key + R"(":[{"label":"embed","kind":"forward","tensors":[0,1],"activation_bytes":64,"flops":1000},
{"label":"head","kind":"backward","tensors":[3,2,0],"activation_bytes":0}]})";
  };
  write(root / "fuzz_model_profile" / "small.json", small("passes"));
  write(root / "fuzz_model_profile" / "small_old_steps_key.json", small("steps"));

  write(root / "fuzz_machine_profile" / "described.json", to_json(describe_machine({})).dump());
  write(root / "fuzz_machine_profile" / "described_4gpu_no_nvme.json",
        to_json(describe_machine({.gpus = 4, .nvme_capacity = 0, .collective_bytes_per_second = 40e9})).dump());
  machine_profile host = describe_machine({.gpus = 2});
  host.name = "host ranks";
  host.fingerprint = "abc123";
  host.kind = device_kind::host;
  for (auto* curve : {&host.all_gather, &host.reduce_scatter, &host.all_reduce}) {
    *curve = {};
    for (byte_count m = 4 * KiB, i = 1; m <= 256 * MiB; m *= 8, ++i) curve->add(m, 1e9 * static_cast<double>(i));
  }
  write(root / "fuzz_machine_profile" / "host_curves.json", to_json(host).dump());

  std::mt19937_64 rng(20261202);
  for (const std::size_t length : {16, 64, 200, 600}) {
    std::string bytes(length, '\0');
    for (auto& b : bytes) b = static_cast<char>(rng() % 256);
    write(root / "fuzz_layout" / ("random_" + std::to_string(length)), bytes);
  }
  return 0;
}
