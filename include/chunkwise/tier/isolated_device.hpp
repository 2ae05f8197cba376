#pragma once
// The isolated device: a device whose memory the host cannot address, as a GPU's, on a machine without one. Each
// block of isolated_device_tier is host memory mapped twice: the address the tier hands out has no access, so any
// load or store through it on the host faults at once (SIGSEGV), and an alias mapping that only the tier's fills and
// copies, isolated_backend's copies (the host backend's streams) and the device's optimizer use (host_alias).
// The device's default stream (isolated_default_stream) stands for a GPU's legacy default stream: its "kernels" run
// there, the runtime queues its stream-ordered work there, and the tier's synchronous calls wait for it first, as the
// CUDA tier's do. runtime/isolated_device.hpp gives the runtime its parts. Linux (memfd_create).
#include <chunkwise/backend/host.hpp>
#include <chunkwise/core/bytes.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/tier/concepts.hpp>
#include <chunkwise/tier/detail/aligned_host_memory.hpp>
#include <chunkwise/tier/detail/budget.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace chunkwise {

/// The blocks of every isolated device tier in the process: the no-access address each was handed out at, and its
/// alias.
class isolated_blocks {
 public:
  static isolated_blocks& instance() {
    static isolated_blocks blocks;
    return blocks;
  }
  void add(const void* device, std::size_t bytes, std::byte* alias) {
    const std::lock_guard lock(mutex_);
    blocks_[address(device)] = {bytes, alias};
  }
  void remove(const void* device) {
    const std::lock_guard lock(mutex_);
    blocks_.erase(address(device));
  }
  /// Whether [p, p + bytes) lies inside one registered block.
  bool contains(const void* p, std::size_t bytes) const {
    const std::lock_guard lock(mutex_);
    const auto at = address(p);
    auto it = blocks_.upper_bound(at);
    if (it == blocks_.begin()) return false;
    --it;
    return at - it->first + bytes <= it->second.bytes;
  }
  /// Where the host may touch `p`: its alias when p is inside an isolated block, else p itself (host memory).
  void* host_alias(const void* p) const {
    const std::lock_guard lock(mutex_);
    const auto at = address(p);
    auto it = blocks_.upper_bound(at);
    if (it == blocks_.begin()) return const_cast<void*>(p);
    --it;
    if (at - it->first >= it->second.bytes) return const_cast<void*>(p);
    return it->second.alias + (at - it->first);
  }

 private:
  struct block {
    std::size_t bytes;
    std::byte* alias;
  };
  static std::uintptr_t address(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, block> blocks_;
};

inline void* host_alias(const void* p) { return isolated_blocks::instance().host_alias(p); }

/// The isolated device's default stream, process-wide as a GPU's legacy default stream. Unless a `queued` object
/// lives, it is the calling thread's (each task at once: the OpenMP passes of train_gpt2's tests); a `queued` object
/// makes it a worker thread for its lifetime, so a test's kernels can still run, or wait, when the trainer moves on.
class isolated_default_stream {
 public:
  static host_stream& get() noexcept { return *current(); }
  /// What the device's synchronous calls do first: wait for everything queued on it (errors stay with its owner).
  static void wait_idle() noexcept {
    try {
      get().synchronize();
    } catch (...) {  // a failed task is its queue owner's to report
    }
  }
  class queued {
   public:
    queued() : previous_(std::exchange(current(), &stream_)) {}
    queued(const queued&) = delete;
    queued& operator=(const queued&) = delete;
    ~queued() {
      wait_idle();
      current() = previous_;
    }

   private:
    host_stream stream_;
    host_stream* previous_;
  };

 private:
  static host_stream*& current() noexcept {
    static host_stream caller(host_stream::caller_thread);
    static host_stream* stream = &caller;
    return stream;
  }
};

/// The device tier: blocks the host cannot address, under a byte budget; fills and copies go through the aliases.
class isolated_device_tier {
 public:
  using space = space::device;
  using handle_type = void*;
  using stream_ref = host_stream&;

  explicit isolated_device_tier(byte_count budget) : budget_("device (isolated, host backend)", budget) {}
  isolated_device_tier(const isolated_device_tier&) = delete;
  isolated_device_tier& operator=(const isolated_device_tier&) = delete;
  ~isolated_device_tier() { isolated_default_stream::wait_idle(); }  // frees queued there use this tier

  // Stream-ordered: usable by work on `stream` at once; freed, or zeroed, when `stream` reaches it.
  void* allocate(host_stream& /*stream*/, byte_count bytes, std::size_t alignment = 0) {
    return allocate_now(bytes, alignment);
  }
  void deallocate(host_stream& stream, void* block, byte_count bytes, std::size_t /*alignment*/ = 0) {
    stream.enqueue([this, block, bytes] { free_now(block, bytes); });
  }
  void fill_zero(host_stream& stream, void* device, byte_count bytes) {
    stream.enqueue([device, bytes] { std::memset(host_alias(device), 0, bytes); });
  }
  // Synchronous: after the work queued on the default stream, as cudaStreamPerThread's calls wait for the legacy one.
  void* allocate_sync(byte_count bytes, std::size_t alignment = 0) {
    isolated_default_stream::wait_idle();
    return allocate_now(bytes, alignment);
  }
  void deallocate_sync(void* block, byte_count bytes, std::size_t /*alignment*/ = 0) noexcept {
    isolated_default_stream::wait_idle();
    free_now(block, bytes);
  }

  // What a device tier the host cannot address supplies (tier/concepts.hpp: host_staged_tier).
  void fill_zero(void* device, byte_count bytes) {
    isolated_default_stream::wait_idle();
    std::memset(host_alias(device), 0, bytes);
  }
  void copy_to_host(void* host, const void* device, byte_count bytes) {
    isolated_default_stream::wait_idle();
    std::memcpy(host, host_alias(device), bytes);
  }
  void copy_from_host(void* device, const void* host, byte_count bytes) {
    isolated_default_stream::wait_idle();
    std::memcpy(host_alias(device), host, bytes);
  }

  [[nodiscard]] tier_stats stats() const noexcept { return budget_.stats(); }
  [[nodiscard]] byte_count capacity() const noexcept { return budget_.capacity(); }
  void note_read(byte_count bytes) noexcept { budget_.note_read(bytes); }
  void note_written(byte_count bytes) noexcept { budget_.note_written(bytes); }

  friend constexpr void get_property(const isolated_device_tier&, device_accessible) noexcept {}

 private:
  static constexpr std::size_t page_bytes = 4096;
  static std::size_t mapped_bytes(byte_count bytes) noexcept { return round_up(bytes == 0 ? 1 : bytes, page_bytes); }

  void* allocate_now(byte_count bytes, std::size_t alignment) {
    if (alignment > page_bytes)
      detail::raise(error_code::invalid_argument, "isolated device tier: alignment " + std::to_string(alignment) +
                                                      " asked; blocks are page-aligned (4096)");
    budget_.reserve(bytes);
    const std::size_t mapped = mapped_bytes(bytes);
    const int fd = ::memfd_create("chunkwise-isolated-device", MFD_CLOEXEC);
    void* device = MAP_FAILED;
    void* alias = MAP_FAILED;
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(mapped)) == 0) {
      device = ::mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
      alias = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    const int e = errno;
    if (fd >= 0) ::close(fd);
    if (device == MAP_FAILED || alias == MAP_FAILED) {
      if (device != MAP_FAILED) ::munmap(device, mapped);
      if (alias != MAP_FAILED) ::munmap(alias, mapped);
      budget_.release(bytes);
      detail::raise(error_code::out_of_memory, "isolated device tier: mapping " + format_bytes(mapped) +
                                                   " failed: " + std::strerror(e));
    }
    isolated_blocks::instance().add(device, mapped, static_cast<std::byte*>(alias));
    return device;
  }
  void free_now(void* block, byte_count bytes) noexcept {
    if (block == nullptr) return;
    const std::size_t mapped = mapped_bytes(bytes);
    void* alias = host_alias(block);
    isolated_blocks::instance().remove(block);
    ::munmap(alias, mapped);
    ::munmap(block, mapped);
    budget_.release(bytes);
  }

  detail::byte_budget budget_;
};

static_assert(memory_tier_with<isolated_device_tier, device_accessible>);
static_assert(!has_property<isolated_device_tier, host_accessible>);
static_assert(host_staged_tier<isolated_device_tier>);

/// Page-locked host memory of the isolated device (as cudaHostAlloc's): page-aligned host memory under a budget,
/// each block registered while it lives, so the backend can tell it from pageable memory.
class isolated_pinned_tier : public detail::host_backend_tier<space::pinned_host> {
 public:
  explicit isolated_pinned_tier(byte_count budget)
      : host_backend_tier("pinned host (isolated, page-locked)", budget, 4096, false) {}

  void* allocate(host_stream& /*stream*/, byte_count bytes, std::size_t alignment = 0) {
    return allocate_sync(bytes, alignment);
  }
  void deallocate(host_stream& stream, void* block, byte_count bytes, std::size_t alignment = 0) {
    stream.enqueue([this, block, bytes, alignment] { deallocate_sync(block, bytes, alignment); });
  }
  void* allocate_sync(byte_count bytes, std::size_t alignment = 0) {
    void* block = host_backend_tier::allocate_sync(bytes, alignment);
    registry().add(block, bytes == 0 ? 1 : bytes, static_cast<std::byte*>(block));
    return block;
  }
  void deallocate_sync(void* block, byte_count bytes, std::size_t alignment = 0) noexcept {
    if (block == nullptr) return;
    registry().remove(block);
    host_backend_tier::deallocate_sync(block, bytes, alignment);
  }
  /// Whether [p, p + bytes) lies in one live block of an isolated pinned tier.
  static bool holds(const void* p, byte_count bytes) {
    return bytes == 0 || registry().contains(p, bytes);
  }

  friend constexpr void get_property(const isolated_pinned_tier&, host_accessible) noexcept {}
  friend constexpr void get_property(const isolated_pinned_tier&, device_accessible) noexcept {}

 private:
  static isolated_blocks& registry() {
    static isolated_blocks blocks;
    return blocks;
  }
};
static_assert(memory_tier_with<isolated_pinned_tier, host_accessible, device_accessible>);

/// The host backend's streams, its copies through the aliases (the DMA engine of this "device"). As a GPU's DMA, it
/// moves between device memory and page-locked host memory (isolated_pinned_tier) only: a copy with pageable host
/// memory is refused, naming it.
class isolated_backend : public host_backend {
 public:
  static constexpr const char* name = "isolated";
  /// The device's default stream (isolated_default_stream), where its kernels run.
  static host_stream& compute() noexcept { return isolated_default_stream::get(); }
  void copy_async(host_stream& stream, void* dst, const void* src, byte_count bytes) {
    check_host_side(dst, src, bytes);
    host_backend::copy_async(stream, host_alias(dst), host_alias(src), bytes);
  }

 private:
  static void check_host_side(const void* dst, const void* src, byte_count bytes) {
    const bool dst_device = host_alias(dst) != dst, src_device = host_alias(src) != src;
    if (dst_device == src_device) return;  // device to device (or host to host: not this backend's business)
    const void* host = dst_device ? src : dst;
    if (!isolated_pinned_tier::holds(host, bytes))
      detail::raise(error_code::invalid_argument,
                    "isolated backend: an asynchronous copy of " + std::to_string(bytes) + " bytes " +
                        (dst_device ? "from" : "to") + " pageable host memory; the device's DMA moves page-locked "
                        "memory only (backend_parts<Backend>::pinned_tier)");
  }
};
static_assert(backend<isolated_backend>);

}  // namespace chunkwise
