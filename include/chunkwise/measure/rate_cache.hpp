#pragma once
// measure_or_load_rate(): a rate a program measures for itself (a trainer's own passes' FLOP/s, which the machine
// profile's generic GEMM rate overstates), kept beside the machine profile: in `cache_directory`/rates-<machine
// fingerprint>.json (profile/rates_json.hpp), under a key the caller composes from everything the rate depends on
// (the model's shape, the dtype, the ranks sharing the cores, the matrix-product engine, the program's build:
// program_build_stamp()). A new measurement revision (the fingerprint) or a rebuilt program (the stamp in the key)
// measures again; so does `measure_again` (a run that wants the rate of the machine's present phase, as
// bench/compare/plans.sh does). keep_rate() and cached_rate_of() keep and read what a run observed rather than
// measured beforehand (the NVMe drive's speed under the run's own traffic, for the next run's planning).
//
// Programs sharing the cache take turns: each holds an exclusive lock on the file's ".lock" beside it from reading
// to writing, measurement included, so no entry is lost to a concurrent writer and no two calibrations slow each
// other down. The file is replaced atomically; an unreadable one is reported, read as empty and replaced, never
// trusted. A cache that cannot be locked or written (read-only) is still read; what is measured then is used and
// reported as not cached. Needs nlohmann_json (the json component), as measure/cache.hpp does.
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/measure/measure.hpp>
#include <chunkwise/profile/rates_json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chunkwise::inline CHUNKWISE_ABI {

struct rate_cache_options {
  bool measure_again = false;  // measure now and replace the cached value
  std::size_t keep = 64;       // rates kept in the file; the oldest go first (old builds' keys pile up otherwise)
  std::function<void(const std::string&)> progress = [](const std::string& line) {
    std::fprintf(stderr, "measure: %s\n", line.c_str());
  };
};

struct cached_rate {
  double value = 0;
  bool measured_now = false;
  std::int64_t measured_at = 0;  // seconds since the Unix epoch
  std::filesystem::path file;    // where it is kept
};

/// The running program's build: its executable's size and modification time, for a key that a rebuild changes
/// (a faster kernel must not inherit the old rate). "unknown" where /proc/self/exe cannot be read.
inline std::string program_build_stamp() {
  struct stat info {};
  if (::stat("/proc/self/exe", &info) != 0) return "unknown";
  return std::to_string(static_cast<long long>(info.st_size)) + "-" +
         std::to_string(static_cast<long long>(info.st_mtime));
}

}  // namespace chunkwise

namespace chunkwise::detail::inline CHUNKWISE_ABI {

/// An exclusive flock on `path` (created if missing) for this object's life.
class exclusive_file_lock {
 public:
  explicit exclusive_file_lock(const std::filesystem::path& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw_posix_failure("open '" + path.string() + "'", errno, {});
    int result;
    do result = ::flock(fd_, LOCK_EX);
    while (result != 0 && errno == EINTR);
    if (result != 0) {
      const int error_number = errno;
      ::close(fd_);
      throw_posix_failure("flock '" + path.string() + "'", error_number, {});
    }
  }
  exclusive_file_lock(const exclusive_file_lock&) = delete;
  exclusive_file_lock& operator=(const exclusive_file_lock&) = delete;
  ~exclusive_file_lock() { ::close(fd_); }  // releases the lock

 private:
  int fd_;
};

}  // namespace chunkwise::detail

namespace chunkwise::detail::inline CHUNKWISE_ABI {

/// Where a rate put() keeps comes from: measured now by measure_or_load_rate, or observed by a run (keep_rate). The
/// messages say which.
enum class rate_origin { measured, observed };

/// The rate file of `cache_directory`, locked and read for this object's life. A cache that cannot be locked (a
/// read-only directory, shared) is still read; put() then keeps the value for this run only and says why.
class rate_file {
 public:
  rate_file(const std::filesystem::path& cache_directory, const std::function<void(const std::string&)>& progress)
      : directory_(cache_directory), file_(cache_file(cache_directory, "rates")), progress_(progress) {
    try {
      std::filesystem::create_directories(directory_);
      lock_ = std::make_unique<const exclusive_file_lock>(file_.string() + ".lock");
    } catch (const std::exception& e) {
      unwritable_ = e.what();
    }
    if (!std::filesystem::exists(file_)) return;
    try {
      rates_ = load_measured_rates(file_);
    } catch (const chunkwise::error& e) {
      progress_(std::string("the cached rates are unreadable; none is trusted, the file is replaced: ") + e.what());
    }
  }

  [[nodiscard]] const std::filesystem::path& file() const noexcept { return file_; }

  [[nodiscard]] const measured_rate* find(const std::string& key) const {
    const auto found = std::find_if(rates_.begin(), rates_.end(), [&](const auto& r) { return r.key == key; });
    return found != rates_.end() ? &*found : nullptr;
  }

  /// `value` (> 0, finite) under `key` (replacing it), newest first, the file cut to `keep` rates and replaced
  /// atomically.
  cached_rate put(const std::string& key, double value, std::size_t keep, rate_origin origin) {
    const bool measured = origin == rate_origin::measured;
    if (!(value > 0) || !std::isfinite(value))
      throw_error(error_code::invalid_argument,
                  std::string(measured ? "measure_or_load_rate: the measurement" : "keep_rate: the observation") +
                      " of '" + key + "' gave " + std::to_string(value) + ", not a rate > 0; nothing was cached");
    cached_rate result{.value = value, .measured_now = true, .measured_at = now(), .file = file_};
    std::erase_if(rates_, [&](const auto& r) { return r.key == key; });
    rates_.insert(rates_.begin(), {key, value, result.measured_at});  // first among rates of the same second
    std::stable_sort(rates_.begin(), rates_.end(),
                     [](const auto& a, const auto& b) { return a.measured_at > b.measured_at; });
    rates_.resize(std::min(rates_.size(), std::max<std::size_t>(keep, 1)));
    if (unwritable_.empty()) {
      try {
        save_measured_rates(rates_, file_);  // atomic: on failure the old file stays
      } catch (const chunkwise::error& e) {
        unwritable_ = e.what();
      }
    }
    if (!unwritable_.empty())
      progress_(std::string(measured ? "the rate measured now is used but not cached"
                                     : "the rate observed now is not cached") +
                ": cannot write the rate cache in " + directory_.string() + " (" + unwritable_ + ")");
    return result;
  }

 private:
  static std::int64_t now() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch()).count();
  }

  std::filesystem::path directory_, file_;
  const std::function<void(const std::string&)>& progress_;
  std::unique_ptr<const exclusive_file_lock> lock_;  // held until the object goes
  std::string unwritable_;                           // why the cache cannot be written, if it cannot
  std::vector<measured_rate> rates_;
};

inline cached_rate as_cached(const measured_rate& rate, const std::filesystem::path& file) {
  return {.value = rate.value, .measured_now = false, .measured_at = rate.measured_at, .file = file};
}

}  // namespace chunkwise::detail

namespace chunkwise::inline CHUNKWISE_ABI {

/// The rate cached under `key` for this machine, or `measure()` (a positive, finite rate) now, saved with the other
/// keys' rates. `measure` runs at most once, under the cache's lock.
template <class Measure>
cached_rate measure_or_load_rate(const std::filesystem::path& cache_directory, const std::string& key,
                                 Measure&& measure, const rate_cache_options& options = {}) {
  if (key.empty()) throw_error(error_code::invalid_argument, "measure_or_load_rate: the key is empty");
  detail::rate_file rates(cache_directory, options.progress);
  if (const auto* found = rates.find(key); found != nullptr && !options.measure_again)
    return detail::as_cached(*found, rates.file());
  return rates.put(key, std::forward<Measure>(measure)(), options.keep, detail::rate_origin::measured);
}

/// The rate cached under `key` for this machine, if there is one (a run's observation of the machine that a later
/// run plans with: how fast a drive went under the run's own traffic).
inline std::optional<cached_rate> cached_rate_of(const std::filesystem::path& cache_directory, const std::string& key,
                                                 const rate_cache_options& options = {}) {
  const detail::rate_file rates(cache_directory, options.progress);
  if (const auto* found = rates.find(key)) return detail::as_cached(*found, rates.file());
  return std::nullopt;
}

/// Caches `value` (> 0, finite) under `key`, replacing what was there: what a run observed, for the next.
inline cached_rate keep_rate(const std::filesystem::path& cache_directory, const std::string& key, double value,
                             const rate_cache_options& options = {}) {
  if (key.empty()) throw_error(error_code::invalid_argument, "keep_rate: the key is empty");
  detail::rate_file rates(cache_directory, options.progress);
  return rates.put(key, value, options.keep, detail::rate_origin::observed);
}

}  // namespace chunkwise
