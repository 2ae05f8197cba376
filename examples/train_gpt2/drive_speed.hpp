#pragma once
// The NVMe drive's speed under the trainer's own traffic, fed back to the next run's planning. The machine profile
// times the drive once, for seconds, at whatever moment it is taken: on this VM's virtual disk, 16 MiB reads went
// 0.96 GB/s a minute after a 24 GB store was deleted, 1.36-1.41 GB/s in the profiles before, and the GPT-2 1.5B
// step's prediction followed (+47%, against +8%). A run that streams its homes through the drive for seconds sees
// the rate its own traffic gets. Its summary compares the bytes the store moved, at the profile's rates for the
// plan's block, with the time the drive was busy, and keeps the ratio in the rate cache (measure/rate_cache.hpp),
// keyed by the drive and the profile's rates (a run that planned with a kept ratio keeps the mean of the two); the
// next run on that drive and profile plans with the profile's rates scaled by it (with_nvme_speed). --recalibrate
// plans with the profile's own.
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/measure/rate_cache.hpp>
#include <chunkwise/profile/machine_profile.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>

namespace gpt2 {

/// "2026-12-07 01:23 UTC" for seconds since the Unix epoch.
inline std::string utc_date(std::int64_t seconds) {
  const auto when = static_cast<std::time_t>(seconds);
  std::tm utc{};
  char text[32] = "?";
  if (gmtime_r(&when, &utc) != nullptr) std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", &utc);
  return text;
}

/// The drive speed a run plans with, and what its summary observes and keeps for the next.
class drive_speed {
 public:
  /// Drive time a run must have seen (the steps after the first) before its observation is kept: a few ms of a
  /// small model's store say little of the drive.
  static constexpr double least_busy_seconds = 1.0;

  drive_speed() = default;

  /// The speed cached for the drive of `store_directory` and this profile (1 where none is, or `profiled_only`).
  drive_speed(const std::filesystem::path& cache, const std::filesystem::path& store_directory,
              const chunkwise::machine_profile& profiled, bool profiled_only)
      : cache_(cache), key_(key_of(store_directory, profiled)), profiled_(profiled) {
    if (profiled_only || profiled.nvme_capacity == 0) return;
    if (const auto cached = chunkwise::cached_rate_of(cache_, key_)) {
      speed_ = cached->value;
      observed_at_ = cached->measured_at;
    }
  }

  /// The machine to plan with: the profile with its drive at the kept speed (the profile's own without one).
  [[nodiscard]] chunkwise::machine_profile machine() const { return chunkwise::with_nvme_speed(profiled_, speed_); }
  /// The planning line, where a run's observation sets the drive's rates ("" where the profile's do).
  [[nodiscard]] std::string planning_line() const {
    if (observed_at_ == 0) return "";
    char line[256];
    std::snprintf(line, sizeof line, "NVMe drive: planned at %.2fx the machine profile's rates, as runs on this drive "
                  "observed it, the last at %s (--recalibrate plans with the profile's)", speed_,
                  utc_date(observed_at_).c_str());
    return line;
  }

  /// The summary's line on one rank's store over `busy_seconds` of drive time: its bytes at the profile's rates for
  /// blocks of `block_bytes` against that time. Kept for the next run when the drive was busy long enough.
  [[nodiscard]] std::string observe(chunkwise::byte_count bytes_read, chunkwise::byte_count bytes_written,
                                    double busy_seconds, chunkwise::byte_count block_bytes) const {
    const double read_rate = chunkwise::nvme_read_rate(profiled_, block_bytes);
    const double write_rate = chunkwise::nvme_write_rate(profiled_, block_bytes);
    if (key_.empty() || busy_seconds <= 0 || read_rate <= 0 || write_rate <= 0) return "";
    const double at_profile = static_cast<double>(bytes_read) / read_rate +
                              static_cast<double>(bytes_written) / write_rate;
    const double observed = at_profile / busy_seconds;
    char line[256];
    std::snprintf(line, sizeof line, "NVMe drive speed: at the profile's rates for %s blocks (read %.2f, write %.2f "
                  "GB/s) these bytes take %.1f s, the drive was busy %.1f s: %.2fx the profile",
                  chunkwise::format_bytes(block_bytes).c_str(), read_rate / 1e9, write_rate / 1e9, at_profile,
                  busy_seconds, observed);
    if (!(observed > 0)) return line;
    if (busy_seconds < least_busy_seconds) return line + std::string("; too little drive time to keep");
    // A run that planned with a kept speed keeps the geometric mean of it and its own: one run's figure moves by
    // 20% from the next's here, a drive that changed speed is followed within a few runs.
    const double next = observed_at_ != 0 ? std::sqrt(speed_ * observed) : observed;
    std::string unwritable;
    chunkwise::rate_cache_options options;
    options.progress = [&](const std::string& why) { unwritable = why; };
    const auto kept = chunkwise::keep_rate(cache_, key_, next, options);
    if (!unwritable.empty()) return line + ("; not kept: " + unwritable);
    char outcome[128];
    std::snprintf(outcome, sizeof outcome, "; the next run on this drive plans with %.2fx%s (kept in ", next,
                  observed_at_ != 0 ? ", between this and the speed this run planned with" : "");
    return line + (outcome + kept.file.string() + ")");
  }

 private:
  /// The drive: the device of the store's directory (or of its nearest existing parent, before the store makes it);
  /// and the profile measured on it, by its rates, so a profile measured again starts afresh.
  static std::string key_of(const std::filesystem::path& store_directory, const chunkwise::machine_profile& profiled) {
    std::filesystem::path existing = std::filesystem::absolute(store_directory);
    struct stat info {};
    while (::stat(existing.c_str(), &info) != 0 && existing.has_parent_path() && existing != existing.parent_path())
      existing = existing.parent_path();
    char key[256];
    std::snprintf(key, sizeof key, "train_gpt2 NVMe drive speed over the profile's: device %u:%u, profiled at 16 MiB "
                  "read %.4g, write %.4g B/s", major(info.st_dev), minor(info.st_dev),
                  chunkwise::nvme_read_rate(profiled, 16 * chunkwise::MiB),
                  chunkwise::nvme_write_rate(profiled, 16 * chunkwise::MiB));
    return key;
  }

  std::filesystem::path cache_;
  std::string key_;
  chunkwise::machine_profile profiled_{};
  double speed_ = 1;
  std::int64_t observed_at_ = 0;  // 0: no observation planned with
};

}  // namespace gpt2
