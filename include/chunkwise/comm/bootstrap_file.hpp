#pragma once
// A rendezvous through a shared file, for launchers without MPI: rank 0 writes a few bytes (an ncclUniqueId), the
// others wait for them. Rank 0 writes a temporary file beside the target, fsyncs it and renames it into place
// (rename is atomic on POSIX file systems, NFS included), so a reader never sees a partial file. Readers poll for
// the file until a timeout and then throw, naming the path and what to check.
//
// Use a fresh path per job (the job id in the name): a file left from an earlier run would be read as this run's,
// because a reader cannot tell the two apart. Rank 0 may remove the file once every rank has connected.
#include <chunkwise/core/error.hpp>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace chunkwise {

namespace detail {
[[noreturn]] inline void raise_bootstrap_io(const char* call, const std::filesystem::path& path, int code) {
  raise(error_code::io_error, std::string(call) + " on '" + path.string() + "' failed: " + std::strerror(code));
}
}  // namespace detail

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename). Called by rank 0.
inline void publish_bootstrap_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  const std::filesystem::path temporary = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) detail::raise_bootstrap_io("open", temporary, errno);
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int code = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      detail::raise_bootstrap_io("write", temporary, code);
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int code = errno;
    ::close(fd);
    ::unlink(temporary.c_str());
    detail::raise_bootstrap_io("fsync", temporary, code);
  }
  if (::close(fd) != 0) detail::raise_bootstrap_io("close", temporary, errno);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int code = errno;
    ::unlink(temporary.c_str());
    detail::raise_bootstrap_io("rename", path, code);
  }
}

/// Waits until `path` exists and returns its `bytes` bytes; polls every `poll`. Throws comm_error after `timeout`,
/// io_error when the file exists but cannot be read or holds another number of bytes.
inline std::vector<std::byte> await_bootstrap_file(const std::filesystem::path& path, std::size_t bytes,
                                                   std::chrono::milliseconds timeout,
                                                   std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      std::vector<std::byte> content(bytes + 1);  // one more: a longer file is the wrong file
      std::size_t got = 0;
      for (;;) {
        const ssize_t n = ::read(fd, content.data() + got, content.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          const int code = errno;
          ::close(fd);
          detail::raise_bootstrap_io("read", path, code);
        }
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
        if (got == content.size()) break;
      }
      ::close(fd);
      if (got != bytes)
        detail::raise(error_code::io_error, "bootstrap file '" + path.string() + "' holds " +
                                                (got > bytes ? "more than " + std::to_string(bytes)
                                                             : std::to_string(got)) +
                                                " bytes; expected " + std::to_string(bytes) +
                                                " (is it another program's file, or from another version?)");
      content.resize(bytes);
      return content;
    }
    if (errno != ENOENT) detail::raise_bootstrap_io("open", path, errno);
    if (std::chrono::steady_clock::now() >= deadline)
      detail::raise(error_code::comm_error,
                    "waited " + std::to_string(timeout.count()) + " ms for rank 0 to write the bootstrap file '" +
                        path.string() + "' (" + std::to_string(bytes) +
                        " bytes); it does not exist. Check that rank 0 runs and that every rank sees the same path "
                        "on a shared file system");
    std::this_thread::sleep_for(poll);
  }
}

}  // namespace chunkwise
