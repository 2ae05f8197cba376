#pragma once
// The NVMe tier: chunk blocks in one preallocated file per store (fallocate), opened with O_DIRECT, moved in requests
// of `io_bytes` with `queue_depth` of them in flight through io_uring, or through a thread pool of pread/pwrite where
// io_uring is not built or not permitted (detected at run time; `describe()` says which path is active). Every request
// carries a CRC-32C computed on write and verified on read: a corrupted block is reported, never returned as data.
//
// Buffers handed to read/write must be aligned to `io_alignment` and have room for round_up(bytes, io_alignment)
// (the pinned staging buffers of the transfer engine are). A block is read back with the byte count it was written
// with: chunks move whole.
//
// A request the kernel completes short is resumed until it has moved all its bytes (from the last io_alignment
// boundary it reached, which O_DIRECT needs); a failed request fails the whole read or write with an io_error naming
// the call, the block, the request, the file and errno's text. A write that fails leaves its block unreadable: its
// bytes on disk are partly old and partly new, and the next read of it throws io_error instead of returning them.
//
// Tests switch on faults through `nvme_options::faults` (a testing::nvme_fault_injector, testing/nvme_faults.hpp): every attempt of every request
// asks it whether to report a short transfer, an errno, or to sleep first. It acts on the system call's result, where
// the real one is handled, on both I/O paths. Without an injector the cost is one null-pointer test per attempt.
#include <chunkwise/core/abi.hpp>
#include <chunkwise/core/worker_threads.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/checked_call.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/core/checksum.hpp>
#include <chunkwise/tier/concepts.hpp>
#include <chunkwise/tier/detail/budget.hpp>
#include <chunkwise/tier/detail/busy_clock.hpp>
#include <chunkwise/testing/nvme_faults.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if CHUNKWISE_HAS_URING
#include <liburing.h>
#endif

namespace chunkwise::inline CHUNKWISE_ABI {

enum class nvme_io_path : std::uint8_t {
  automatic,  // io_uring when built and permitted, else the thread pool
  io_uring,   // io_uring or an error
  threads,    // the pread/pwrite thread pool
};

struct nvme_options {
  std::filesystem::path directory = std::filesystem::temp_directory_path();
  byte_count capacity = 0;      // bytes the store file holds (rounded down to whole blocks)
  byte_count block_bytes = 0;   // bytes of one block (a chunk); rounded up to io_alignment on disk
  byte_count io_bytes = 1 * MiB;  // bytes of one request; each carries a checksum
  unsigned queue_depth = 4;     // requests in flight
  nvme_io_path path = nvme_io_path::automatic;
  bool direct_io = true;        // O_DIRECT; where the file system refuses it (tmpfs) the store says so and runs buffered
  std::shared_ptr<testing::nvme_fault_injector> faults{};  // tests: faults injected into I/O results; null: none
};

/// A block of the store. Default-constructed: no block.
struct nvme_block {
  std::uint32_t slot = std::numeric_limits<std::uint32_t>::max();
  friend constexpr bool operator==(nvme_block, nvme_block) = default;
};

class nvme_tier {
 public:
  using space = space::nvme;
  using handle_type = nvme_block;
  using stream_ref = immediate_stream;
  static constexpr std::size_t io_alignment = 4096;

  explicit nvme_tier(const nvme_options& options)
      : options_(validated(options)),
        slot_bytes_(round_up(options_.block_bytes, io_alignment)),
        slots_(slot_count(options_, slot_bytes_)),
        segments_per_slot_(static_cast<std::uint32_t>(div_ceil(slot_bytes_, options_.io_bytes))),
        budget_("NVMe", byte_count{slots_} * slot_bytes_) {
    check_room();  // before any allocation sized by the capacity: a store that cannot exist fails here
    // Bookkeeping before the file: nothing may fail after the file exists without removing it.
    checksums_.assign(std::size_t{slots_} * segments_per_slot_, 0);
    written_bytes_.assign(slots_, 0);
    write_failed_.assign(slots_, 0);
    allocated_.assign(slots_, 0);
    free_slots_.reserve(slots_);
    for (std::uint32_t s = slots_; s > 0; --s) free_slots_.push_back(s - 1);
    open_store();
    try {
      start_io();
    } catch (...) {
      close_store();
      throw;
    }
  }
  nvme_tier(const nvme_tier&) = delete;
  nvme_tier& operator=(const nvme_tier&) = delete;
  ~nvme_tier() {
    pool_.reset();
#if CHUNKWISE_HAS_URING
    for (auto& ring : rings_) io_uring_queue_exit(ring.get());
#endif
    close_store();
  }

  // ---- memory_tier ----
  nvme_block allocate(immediate_stream, byte_count bytes, std::size_t alignment = 0) {
    return allocate_sync(bytes, alignment);
  }
  void deallocate(immediate_stream, nvme_block block, byte_count bytes, std::size_t alignment = 0) {
    deallocate_sync(block, bytes, alignment);
  }
  nvme_block allocate_sync(byte_count bytes, std::size_t /*alignment: blocks are io_alignment-aligned*/ = 0) {
    if (bytes > options_.block_bytes)
      detail::raise(error_code::invalid_argument, "NVMe tier: asked for a block of " + format_bytes(bytes) + " (" +
                                              std::to_string(bytes) + " bytes); this store's blocks hold " +
                                              format_bytes(options_.block_bytes));
    std::lock_guard lock(slots_mutex_);
    budget_.reserve(slot_bytes_);  // throws out_of_memory with the store's numbers when no slot is free
    const std::uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    written_bytes_[slot] = 0;
    write_failed_[slot] = 0;
    allocated_[slot] = 1;
    return nvme_block{slot};
  }
  void deallocate_sync(nvme_block block, byte_count /*bytes*/ = 0, std::size_t /*alignment*/ = 0) {
    check_block(block, "deallocate");
    std::lock_guard lock(slots_mutex_);
    allocated_[block.slot] = 0;
    free_slots_.push_back(block.slot);
    budget_.release(slot_bytes_);
  }
  [[nodiscard]] tier_stats stats() const noexcept {
    tier_stats s = budget_.stats();
    s.busy_seconds = busy_.seconds();
    return s;
  }
  [[nodiscard]] byte_count capacity() const noexcept { return budget_.capacity(); }
  // The store counts its own traffic in read/write; these exist for the concept and for callers that bypass them.
  void note_read(byte_count bytes) noexcept { budget_.note_read(bytes); }
  void note_written(byte_count bytes) noexcept { budget_.note_written(bytes); }

  friend constexpr void get_property(const nvme_tier&, file_backed) noexcept {}

  // ---- block I/O ----
  /// Writes `bytes` (<= block_bytes) from `src` into `block`, checksumming each request. Blocks the calling thread
  /// (the transfer engine calls it from its own worker).
  void write(nvme_block block, const void* src, byte_count bytes) {
    check_io(block, src, bytes, "write");
    // Until the write has fully succeeded the block is unreadable: a failed write leaves it partly old, partly new
    // on disk, with the new checksums, so its next read throws rather than return stale or mixed bytes.
    written_bytes_[block.slot] = 0;
    write_failed_[block.slot] = 1;
    run_io(block, const_cast<void*>(src), bytes, /*writing=*/true);
    write_failed_[block.slot] = 0;
    written_bytes_[block.slot] = bytes;
    budget_.note_written(bytes);
  }
  /// Reads `block` (written with exactly `bytes`) into `dst`, verifying every request's checksum.
  void read(nvme_block block, void* dst, byte_count bytes) {
    check_io(block, dst, bytes, "read");
    const byte_count written = written_bytes_[block.slot];
    if (write_failed_[block.slot] != 0)
      detail::raise(error_code::io_error, "NVMe tier: read of block " + std::to_string(block.slot) +
                                              ", whose last write failed: its bytes on disk are partly those of "
                                              "that write, so the store refuses them; write the block again");
    if (written == 0)
      detail::raise(error_code::illegal_state, "NVMe tier: read of block " + std::to_string(block.slot) +
                                           ", which holds no data (never written, or its last write failed)");
    if (written != bytes)
      detail::raise(error_code::invalid_argument, "NVMe tier: read of " + std::to_string(bytes) + " bytes from block " +
                                              std::to_string(block.slot) + ", which was written with " +
                                              std::to_string(written) + " bytes; blocks are read whole");
    run_io(block, dst, bytes, /*writing=*/false);
    budget_.note_read(bytes);
  }

  // ---- what the store is ----
  [[nodiscard]] nvme_io_path io_path() const noexcept { return active_path_; }
  [[nodiscard]] bool direct_io() const noexcept { return direct_io_active_; }
  [[nodiscard]] const std::filesystem::path& file() const noexcept { return file_; }
  [[nodiscard]] byte_count block_bytes() const noexcept { return options_.block_bytes; }
  [[nodiscard]] byte_count slot_bytes() const noexcept { return slot_bytes_; }
  [[nodiscard]] std::uint32_t block_count() const noexcept { return slots_; }
  [[nodiscard]] const nvme_options& options() const noexcept { return options_; }
  /// Byte offset of a block in the store file (tests corrupt blocks through it).
  [[nodiscard]] byte_count file_offset(nvme_block block) const noexcept { return byte_count{block.slot} * slot_bytes_; }

  /// "io_uring, queue depth 4, 1.00 MiB requests, O_DIRECT, /tmp/chunkwise-store-12-0.bin" or the fallback and why.
  [[nodiscard]] std::string describe() const {
    std::string text = active_path_ == nvme_io_path::io_uring
                           ? "io_uring"
                           : "pread/pwrite thread pool (" + std::to_string(options_.queue_depth) + " threads)";
    text += ", queue depth " + std::to_string(options_.queue_depth) + ", " + format_bytes(options_.io_bytes) +
            " requests, " + (direct_io_active_ ? "O_DIRECT" : "buffered (O_DIRECT refused by the file system)") +
            ", " + std::to_string(slots_) + " blocks of " + format_bytes(slot_bytes_) + " in " + file_.string();
    if (!fallback_reason_.empty()) text += "; io_uring not used: " + fallback_reason_;
    return text;
  }

 private:
  static nvme_options validated(const nvme_options& options) {
    if (options.block_bytes == 0)
      detail::raise(error_code::invalid_argument, "NVMe tier: block_bytes is 0; set it to the chunk size");
    if (options.io_bytes == 0 || options.io_bytes % io_alignment != 0)
      detail::raise(error_code::invalid_argument, "NVMe tier: io_bytes " + std::to_string(options.io_bytes) +
                                              " is not a positive multiple of " + std::to_string(io_alignment));
    if (options.queue_depth == 0 || options.queue_depth > 4096)
      detail::raise(error_code::invalid_argument, "NVMe tier: queue_depth " + std::to_string(options.queue_depth) +
                                              " is outside 1..4096");
    return options;
  }
  static std::uint32_t slot_count(const nvme_options& options, byte_count slot_bytes) {
    const byte_count slots =
        std::min<byte_count>(options.capacity / slot_bytes, std::numeric_limits<std::uint32_t>::max() - 1);
    if (slots == 0)
      detail::raise(error_code::invalid_argument,
            "NVMe tier: a capacity of " + format_bytes(options.capacity) + " (" + std::to_string(options.capacity) +
                " bytes) holds no block of " + format_bytes(slot_bytes) + "; give at least one block's bytes");
    return static_cast<std::uint32_t>(slots);
  }

  // The directory exists, and the file fits the file size limit and the free space.
  void check_room() const {
    const auto& dir = options_.directory;
    std::error_code ec;
    const auto status = std::filesystem::status(dir, ec);
    if (!std::filesystem::exists(status))
      detail::raise(error_code::io_error, "NVMe tier: store directory '" + dir.string() + "' does not exist" +
                                      (ec && ec != std::errc::no_such_file_or_directory ? " (" + ec.message() + ")"
                                                                                       : std::string()) +
                                      "; create it or point the store elsewhere");
    if (!std::filesystem::is_directory(status))
      detail::raise(error_code::io_error, "NVMe tier: store path '" + dir.string() + "' is not a directory");

    const byte_count file_bytes = byte_count{slots_} * slot_bytes_;
    const std::string context = "NVMe tier: store in '" + dir.string() + "'";
    // A file size limit below the store would make fallocate raise SIGXFSZ (default action: kill the process):
    // check it first and fail with a message instead.
    if (struct rlimit limit {}; ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
                                 limit.rlim_cur < file_bytes) {
      detail::raise(error_code::io_error,
                    context + ": the store needs a file of " + format_bytes(file_bytes) + " (" +
                        std::to_string(file_bytes) + " bytes), over the process's file size limit RLIMIT_FSIZE of " +
                        format_bytes(limit.rlim_cur) + "; raise it (ulimit -f) or shrink the store");
    }
    // A store larger than the free space fails here, before fallocate would fill the disk on its way to ENOSPC.
    if (struct statvfs fs {}; ::statvfs(dir.c_str(), &fs) == 0 && byte_count{fs.f_bavail} * fs.f_frsize < file_bytes) {
      detail::raise(error_code::io_error, context + ": no space: the store needs " + format_bytes(file_bytes) + " (" +
                                              std::to_string(file_bytes) + " bytes), '" + dir.string() + "' has " +
                                              format_bytes(byte_count{fs.f_bavail} * fs.f_frsize) +
                                              " free; shrink the store or free space");
    }
  }

  void open_store() {
    const auto& dir = options_.directory;
    // pid, this object's address and a counter: unique among live stores even where translation units of two ABI
    // namespaces (core/abi.hpp) each have their own counter.
    static std::atomic<unsigned> store_counter{0};
    char self[24];
    std::snprintf(self, sizeof self, "%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(this)));
    file_ = dir / ("chunkwise-store-" + std::to_string(::getpid()) + "-" + self + "-" +
                   std::to_string(store_counter++) + ".bin");
    const std::string context = "NVMe tier: store file '" + file_.string() + "'";
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    direct_io_active_ = false;
    if (options_.direct_io) {
      fd_ = ::open(file_.c_str(), flags | O_DIRECT, 0600);
      if (fd_ >= 0) direct_io_active_ = true;
      else if (errno == EINVAL) (void)::unlink(file_.c_str());  // the file system refuses O_DIRECT: run buffered
    }
    if (fd_ < 0) fd_ = ::open(file_.c_str(), flags, 0600);
    if (fd_ < 0) {
      const int e = errno;
      throw_posix_failure("open", e,
                          context + (e == EACCES || e == EPERM || e == EROFS ? " (no permission to create it in '" +
                                                                                   dir.string() + "')"
                                                                             : std::string()));
    }
    const byte_count file_bytes = byte_count{slots_} * slot_bytes_;
    int rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(file_bytes));
    int e = rc == 0 ? 0 : errno;
    if (rc != 0 && e == EOPNOTSUPP) {
      e = ::posix_fallocate(fd_, 0, static_cast<off_t>(file_bytes));  // returns the error number
      rc = e == 0 ? 0 : -1;
    }
    if (options_.faults) {
      const testing::nvme_fault fault = options_.faults->on_attempt({testing::nvme_op::allocate, 0, 0, 0, file_bytes, 0});
      if (fault.what == testing::nvme_fault::kind::delay) std::this_thread::sleep_for(fault.delay);
      if (fault.what == testing::nvme_fault::kind::error) {
        rc = -1;
        e = fault.error_number;
      }
    }
    if (rc != 0) {
      std::string why;
      if (e == ENOSPC) {
        struct statvfs fs {};
        if (::statvfs(dir.c_str(), &fs) == 0)
          why = " (no space: the store needs " + format_bytes(file_bytes) + ", '" + dir.string() + "' has " +
                format_bytes(byte_count{fs.f_bavail} * fs.f_frsize) + " free)";
      } else if (e == EFBIG) {
        why = " (the store needs a file of " + format_bytes(file_bytes) +
              ", over the process's file size limit RLIMIT_FSIZE or the file system's maximum)";
      }
      close_store();
      throw_posix_failure("fallocate", e, context + " of " + format_bytes(file_bytes) + why);
    }
  }

  void close_store() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
      ::unlink(file_.c_str());
    }
  }

  void start_io() {
    active_path_ = nvme_io_path::threads;
#if CHUNKWISE_HAS_URING
    if (options_.path != nvme_io_path::threads) {
      auto ring = std::make_unique<io_uring>();
      const int rc = io_uring_queue_init(options_.queue_depth, ring.get(), 0);
      if (rc == 0) {
        rings_.push_back(std::move(ring));
        idle_rings_.push_back(rings_.back().get());
        active_path_ = nvme_io_path::io_uring;
        return;
      }
      fallback_reason_ = std::string("io_uring_queue_init(") + std::to_string(options_.queue_depth) +
                         ") failed: " + std::strerror(-rc);
      if (options_.path == nvme_io_path::io_uring)
        detail::raise(error_code::unsupported, "NVMe tier: io_uring asked for, but " + fallback_reason_);
    }
#else
    if (options_.path == nvme_io_path::io_uring)
      detail::raise(error_code::unsupported, "NVMe tier: io_uring asked for, but chunkwise was built without liburing "
                                     "(link chunkwise::uring)");
    if (options_.path == nvme_io_path::automatic) fallback_reason_ = "built without liburing";
#endif
    pool_ = std::make_unique<worker_threads>(options_.queue_depth);
  }

  void check_block(nvme_block block, const char* what) const {
    if (block.slot >= slots_)
      detail::raise(error_code::invalid_argument, std::string("NVMe tier: ") + what + " of block " +
                                              std::to_string(block.slot) + "; the store has " +
                                              std::to_string(slots_) + " blocks");
    if (allocated_[block.slot] == 0)
      detail::raise(error_code::illegal_state, std::string("NVMe tier: ") + what + " of block " +
                                                   std::to_string(block.slot) + ", which is not allocated");
  }
  void check_io(nvme_block block, const void* buffer, byte_count bytes, const char* what) const {
    check_block(block, what);
    if (bytes == 0 || bytes > options_.block_bytes)
      detail::raise(error_code::invalid_argument, std::string("NVMe tier: ") + what + " of " + std::to_string(bytes) +
                                              " bytes; blocks hold 1.." + std::to_string(options_.block_bytes));
    if (reinterpret_cast<std::uintptr_t>(buffer) % io_alignment != 0)
      detail::raise(error_code::invalid_argument, std::string("NVMe tier: ") + what + " buffer " +
                                              std::to_string(reinterpret_cast<std::uintptr_t>(buffer)) +
                                              " is not aligned to " + std::to_string(io_alignment) +
                                              " bytes (O_DIRECT); use a pinned staging buffer");
  }

  // One request: segment `index` of a block, `length` bytes (a multiple of io_alignment) at file `offset`.
  struct segment {
    std::uint32_t index;
    byte_count offset;
    byte_count length;
    unsigned char* buffer;
  };

  std::vector<segment> segments_of(nvme_block block, void* buffer, byte_count bytes) const {
    const byte_count padded = round_up(bytes, io_alignment);
    std::vector<segment> segments;
    segments.reserve(div_ceil(padded, options_.io_bytes));
    for (byte_count at = 0; at < padded; at += options_.io_bytes) {
      segments.push_back(segment{static_cast<std::uint32_t>(at / options_.io_bytes), file_offset(block) + at,
                                 std::min(options_.io_bytes, padded - at), static_cast<unsigned char*>(buffer) + at});
    }
    return segments;
  }

  std::uint32_t& checksum_of(nvme_block block, std::uint32_t segment_index) {
    return checksums_[std::size_t{block.slot} * segments_per_slot_ + segment_index];
  }

  void verify(nvme_block block, const segment& s) {
    const std::uint32_t stored = checksum_of(block, s.index);
    const std::uint32_t found = crc32c(s.buffer, s.length);
    if (stored != found) {
      char text[64];
      std::snprintf(text, sizeof text, "stored crc32c 0x%08X, read 0x%08X", stored, found);
      detail::raise(error_code::io_error, "NVMe tier: checksum mismatch in block " + std::to_string(block.slot) +
                                      " request " + std::to_string(s.index) + " (file offset " +
                                      std::to_string(s.offset) + ", " + std::to_string(s.length) + " bytes): " +
                                      text + "; the store file " + file_.string() + " is corrupted");
    }
  }

  std::string io_context(const char* op, nvme_block block, const segment& s) const {
    return std::string("NVMe tier: ") + op + " of block " + std::to_string(block.slot) + " request " +
           std::to_string(s.index) + " (" + std::to_string(s.length) + " bytes at offset " +
           std::to_string(s.offset) + " of " + file_.string() + ")";
  }

  // One request across its attempts. `moved` stays a multiple of io_alignment: a transfer the kernel completes short
  // is resumed from the last aligned byte it reached (O_DIRECT needs aligned offsets; moving the tail of an aligned
  // unit twice is harmless: a read reads the same bytes, a write writes them).
  struct progress {
    byte_count moved = 0;
    unsigned attempts = 0;
    unsigned without_progress = 0;  // consecutive attempts that moved no aligned unit (short, EINTR, EAGAIN)
  };
  static constexpr unsigned max_attempts_without_progress = 16;

  // The result of one attempt (bytes moved, or -errno) as the store handles it: the system call's own, or what the
  // fault injector makes of it.
  long long observed(bool writing, nvme_block block, const segment& s, const progress& p, long long result) const {
    if (!options_.faults) return result;
    const testing::nvme_fault fault = options_.faults->on_attempt({writing ? testing::nvme_op::write : testing::nvme_op::read, block.slot,
                                                          s.index, s.offset + p.moved, s.length - p.moved,
                                                          p.attempts});
    switch (fault.what) {
      case testing::nvme_fault::kind::none: return result;
      case testing::nvme_fault::kind::delay: std::this_thread::sleep_for(fault.delay); return result;
      case testing::nvme_fault::kind::error: return -static_cast<long long>(fault.error_number);
      case testing::nvme_fault::kind::short_transfer:
        return result <= 0 ? result : std::max<long long>(1, result - static_cast<long long>(fault.missing));
    }
    return result;
  }

  // Takes the result of one attempt of request `s`: true when the request has moved all its bytes, false when it
  // must be resumed at `p.moved`; throws io_error when it failed or keeps making no progress.
  bool advance(bool writing, const char* call, nvme_block block, const segment& s, progress& p, long long result) const {
    ++p.attempts;
    const char* op = writing ? "write" : "read";
    if (result == -EINTR || result == -EAGAIN || (result > 0 && p.moved + static_cast<byte_count>(result) < s.length &&
                                                  round_down(p.moved + static_cast<byte_count>(result), io_alignment) ==
                                                      p.moved)) {
      if (++p.without_progress < max_attempts_without_progress) return false;
      detail::raise(error_code::io_error,
                    io_context(op, block, s) + ": " + call + " made no progress in " +
                        std::to_string(max_attempts_without_progress) + " attempts after " + std::to_string(p.moved) +
                        " bytes (last result: " +
                        (result < 0 ? std::string(std::strerror(static_cast<int>(-result)))
                                    : "a short transfer of " + std::to_string(result) + " bytes") +
                        ")");
    }
    if (result < 0) {
      const int e = static_cast<int>(-result);
      std::string context = io_context(op, block, s);
      if (e == ENOSPC) {
        context += " (disk full: the write still needed " + std::to_string(s.length - p.moved) + " bytes of this " +
                   std::to_string(s.length) + "-byte request";
        if (struct statvfs fs {}; ::statvfs(options_.directory.c_str(), &fs) == 0)
          context += "; '" + options_.directory.string() + "' has " +
                     format_bytes(byte_count{fs.f_bavail} * fs.f_frsize) + " free";
        context += "; the store file was preallocated, so the file system under it ran out of blocks: free space)";
      }
      throw_posix_failure(call, e, context);
    }
    if (result == 0)
      detail::raise(error_code::io_error, io_context(op, block, s) + ": " + call + " moved 0 bytes after " +
                                              std::to_string(p.moved) + " of " + std::to_string(s.length) +
                                              (writing ? "" : " (end of file: the store file is shorter than it was made)"));
    const byte_count reached = p.moved + static_cast<byte_count>(result);
    if (reached >= s.length) return true;
    p.moved = round_down(reached, io_alignment);
    p.without_progress = 0;
    return false;
  }

  static constexpr byte_count round_down(byte_count value, byte_count alignment) noexcept {
    return value - value % alignment;
  }

  void run_io(nvme_block block, void* buffer, byte_count bytes, bool writing) {
    const auto segments = segments_of(block, buffer, bytes);
    const auto busy = busy_.busy();
#if CHUNKWISE_HAS_URING
    if (active_path_ == nvme_io_path::io_uring) return run_uring(block, segments, writing);
#endif
    run_threads(block, segments, writing);
  }

#if CHUNKWISE_HAS_URING
  // Keeps queue_depth requests in flight; checksums of a write are computed just after its submission, those of a
  // read just after its completion and the refill of the queue, so the CPU work overlaps the device's. A request
  // completed short goes back in the queue for the rest of its bytes.
  void run_uring(nvme_block block, const std::vector<segment>& segments, bool writing) {
    ring_lease lease(*this);
    io_uring* const ring = lease.ring;
    const char* const call = writing ? "io_uring write" : "io_uring read";
    std::vector<progress> state(segments.size());
    std::vector<std::size_t> resume;  // requests completed short, to submit again
    std::size_t next = 0, in_flight = 0;
    std::exception_ptr failure;
    auto queue = [&](std::size_t i) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) return false;
      const segment& s = segments[i];
      const byte_count at = state[i].moved;
      if (writing) {
        io_uring_prep_write(sqe, fd_, s.buffer + at, static_cast<unsigned>(s.length - at), s.offset + at);
      } else {
        io_uring_prep_read(sqe, fd_, s.buffer + at, static_cast<unsigned>(s.length - at), s.offset + at);
      }
      io_uring_sqe_set_data64(sqe, i);
      return true;
    };
    auto submit_more = [&] {
      const std::size_t first_new = next;
      unsigned queued = 0;
      std::size_t first_queued = 0;
      while (!failure && in_flight + queued < options_.queue_depth) {
        const std::size_t i = !resume.empty() ? resume.back() : next;
        if (i == segments.size() || !queue(i)) break;
        if (!resume.empty()) resume.pop_back();
        else ++next;
        if (queued++ == 0) first_queued = i;
      }
      if (queued == 0) return;
      int rc = 0;
      testing::nvme_fault fault{};
      if (options_.faults)
        fault = options_.faults->on_attempt({testing::nvme_op::submit, block.slot, segments[first_queued].index,
                                             segments[first_queued].offset, 0, 0});
      if (fault.what == testing::nvme_fault::kind::delay) std::this_thread::sleep_for(fault.delay);
      if (fault.what == testing::nvme_fault::kind::error) {
        rc = -fault.error_number;  // stands in for the call: the batch stays in the ring, unsubmitted
      } else {
        do rc = io_uring_submit(ring);
        while (rc == -EINTR);
      }
      // The kernel only reads a write's buffer: its checksum is computed while the device works.
      if (writing)
        for (std::size_t i = first_new; i < next; ++i)
          checksum_of(block, segments[i].index) = crc32c(segments[i].buffer, segments[i].length);
      if (rc == static_cast<int>(queued)) {
        in_flight += queued;
        return;
      }
      // Requests the kernel did not take stay in the ring, where its next user would submit them: retire the ring
      // (its exit drops them) once those that were taken have completed, and fail.
      lease.broken = true;
      in_flight += rc > 0 ? static_cast<std::size_t>(rc) : 0;
      failure = std::make_exception_ptr(
          error(error_code::io_error, io_context(writing ? "write" : "read", block, segments[first_queued]) +
                                          ": io_uring_submit took " + std::to_string(rc > 0 ? rc : 0) + " of " +
                                          std::to_string(queued) + " requests" +
                                          (rc < 0 ? std::string(": ") + std::strerror(-rc) : std::string())));
    };
    submit_more();
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        // The ring is broken: nothing more completes. Retire it and report.
        lease.broken = true;
        throw_posix_failure("io_uring_wait_cqe", -rc, "NVMe tier '" + file_.string() + "'");
      }
      const auto index = static_cast<std::size_t>(io_uring_cqe_get_data64(cqe));
      const segment& s = segments[index];
      const long long result = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      --in_flight;
      bool complete = false;
      if (!failure) {
        try {
          complete = advance(writing, call, block, s, state[index], observed(writing, block, s, state[index], result));
          if (!complete) resume.push_back(index);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      submit_more();  // refill the queue first; then verify this request while the others run
      if (complete && !writing && !failure) {
        try {
          verify(block, s);
        } catch (...) {
          failure = std::current_exception();
        }
      }
    }
    if (failure) std::rethrow_exception(failure);
  }
#endif

  // The fallback: each request is one task on the pool (queue_depth threads), so queue_depth are in flight.
  void run_threads(nvme_block block, const std::vector<segment>& segments, bool writing) {
    struct countdown {
      std::mutex mutex;
      std::condition_variable done;
      std::size_t remaining;
      std::exception_ptr failure;
    } state{{}, {}, segments.size(), nullptr};
    for (const segment& s : segments) {
      pool_->push([this, &state, &s, block, writing] {
        std::exception_ptr failure;
        try {
          if (writing) checksum_of(block, s.index) = crc32c(s.buffer, s.length);
          progress p;
          for (;;) {
            const auto offset = static_cast<off_t>(s.offset + p.moved);
            const ssize_t n = writing ? ::pwrite(fd_, s.buffer + p.moved, s.length - p.moved, offset)
                                      : ::pread(fd_, s.buffer + p.moved, s.length - p.moved, offset);
            const long long result = n < 0 ? -static_cast<long long>(errno) : static_cast<long long>(n);
            if (advance(writing, writing ? "pwrite" : "pread", block, s, p, observed(writing, block, s, p, result)))
              break;
          }
          if (!writing) verify(block, s);
        } catch (...) {
          failure = std::current_exception();
        }
        std::lock_guard lock(state.mutex);
        // This thread lets go of its reference under the lock: the waiter may rethrow and free the exception as
        // soon as it sees remaining == 0 (and ThreadSanitizer cannot see exception_ptr's own atomic count).
        if (failure && !state.failure) state.failure = std::move(failure);
        failure = nullptr;
        if (--state.remaining == 0) state.done.notify_all();
      });
    }
    std::unique_lock lock(state.mutex);
    state.done.wait(lock, [&] { return state.remaining == 0; });
    if (state.failure) std::rethrow_exception(state.failure);
  }

  nvme_options options_;
  byte_count slot_bytes_;
  std::uint32_t slots_;
  std::uint32_t segments_per_slot_;
  detail::byte_budget budget_;
  detail::busy_clock busy_;  // what measure_nvme's rates time too: the calls, checksums included
  std::filesystem::path file_;
  int fd_ = -1;
  bool direct_io_active_ = false;
  nvme_io_path active_path_ = nvme_io_path::threads;
  std::string fallback_reason_;
  std::unique_ptr<worker_threads> pool_;
#if CHUNKWISE_HAS_URING
  // Rings: one per thread doing I/O at a time (a fetch and a write-back run side by side), created on demand up to
  // max_rings; a thread beyond that waits for one.
  static constexpr std::size_t max_rings = 4;
  std::mutex rings_mutex_;
  std::condition_variable ring_idle_;
  std::vector<std::unique_ptr<io_uring>> rings_;
  std::vector<io_uring*> idle_rings_;

  struct ring_lease {
    nvme_tier& store;
    io_uring* ring = nullptr;
    bool broken = false;
    explicit ring_lease(nvme_tier& owner) : store(owner) {
      std::unique_lock lock(store.rings_mutex_);
      if (store.idle_rings_.empty() && store.rings_.size() < max_rings) {
        auto fresh = std::make_unique<io_uring>();
        const int rc = io_uring_queue_init(store.options_.queue_depth, fresh.get(), 0);
        if (rc == 0) {
          store.rings_.push_back(std::move(fresh));
          ring = store.rings_.back().get();
          return;
        }
        if (store.rings_.empty())  // every earlier ring broke and no new one starts: nothing to wait for
          throw_posix_failure("io_uring_queue_init", -rc, "NVMe tier '" + store.file_.string() + "'");
      }
      store.ring_idle_.wait(lock, [this] { return !store.idle_rings_.empty(); });
      ring = store.idle_rings_.back();
      store.idle_rings_.pop_back();
    }
    ring_lease(const ring_lease&) = delete;
    ring_lease& operator=(const ring_lease&) = delete;
    ~ring_lease() {
      if (broken) {  // never handed out again; a fresh ring may take its place
        std::lock_guard lock(store.rings_mutex_);
        io_uring_queue_exit(ring);
        std::erase_if(store.rings_, [this](const std::unique_ptr<io_uring>& r) { return r.get() == ring; });
        return;
      }
      {
        std::lock_guard lock(store.rings_mutex_);
        store.idle_rings_.push_back(ring);
      }
      store.ring_idle_.notify_one();
    }
  };
#endif
  std::mutex slots_mutex_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<std::uint32_t> checksums_;
  std::vector<byte_count> written_bytes_;
  std::vector<unsigned char> write_failed_;  // per slot: its last write did not complete
  std::vector<unsigned char> allocated_;  // per slot; read by I/O threads for their own slots only
};

static_assert(memory_tier_with<nvme_tier, file_backed>);
static_assert(block_store_tier<nvme_tier>);
static_assert(!has_property<nvme_tier, host_accessible>);

}  // namespace chunkwise
