// house_abi_mix: both halves round-trip a block through their own nvme_tier in one program, both stores open at once
// (see abi_mix.hpp).
// Passes when both round trips are exact, the halves live in different ABI namespaces and used different I/O paths
// (io_uring and the thread pool). Where the kernel refuses io_uring (a seccomp profile, io_uring_disabled) the
// io_uring half falls back to threads and the test is skipped (77) after checking the rest.
#include "abi_mix.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

namespace {

void print(const char* half, const abi_mix::report& r) {
  std::printf("%s: namespace chunkwise::%s, sizeof(nvme_tier) %zu, I/O path %s, round trip %s\n  %s\n", half,
              r.abi.c_str(), r.tier_bytes, r.io_path.empty() ? "-" : r.io_path.c_str(),
              !r.error.empty() ? ("failed: " + r.error).c_str() : r.exact ? "exact" : "NOT exact",
              r.describe.c_str());
}

}  // namespace

int main() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/chunkwise-abi-mix-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror(("mkdtemp " + pattern).c_str());
    return 1;
  }
  // One directory per half: a store's file name is unique within its ABI namespace (a counter in nvme_tier), not
  // across the two.
  const std::filesystem::path directory = pattern;
  std::filesystem::create_directory(directory / "with");
  std::filesystem::create_directory(directory / "without");
  // The io_uring half writes its block, the other half runs its whole round trip, the io_uring half reads back: two
  // stores of two layouts open at once.
  abi_mix::report without;
  const abi_mix::report with = abi_mix::round_trip_with_uring(directory / "with", 1, [&] {
    without = abi_mix::round_trip_without_uring(directory / "without", 2, {});
  });
  std::error_code ec;
  std::filesystem::remove_all(directory, ec);
  print("with io_uring   ", with);
  print("without io_uring", without);

  int failures = 0;
  const auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("FAILED: %s\n", what);
      ++failures;
    }
  };
  check(with.built_with_uring && !without.built_with_uring, "one half is built with io_uring, the other without");
  check(with.abi != without.abi, "the halves live in different ABI namespaces");
  check(with.tier_bytes != without.tier_bytes, "nvme_tier differs between the halves (else this test shows nothing)");
  check(with.error.empty() && with.exact, "the io_uring half reads back exactly what it wrote");
  check(without.error.empty() && without.exact, "the other half reads back exactly what it wrote");
  check(without.io_path == "threads", "the half without io_uring uses the thread pool");
  if (failures > 0) return 1;
  if (with.io_path != "io_uring") {
    std::printf("SKIPPED: io_uring is not permitted here, so both halves used the thread pool; the rest holds\n");
    return 77;
  }
  std::printf("both halves round-trip exactly, each through its own nvme_tier: io_uring and the thread pool\n");
  return 0;
}
