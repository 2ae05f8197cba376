#pragma once
// Files that are either the old version or the new one, never half of each: write a temporary file beside the
// target, fsync it, rename it over the target, fsync the directory. Whatever fails, the target keeps its old
// contents and the temporary file is removed.
#include <chunkwise/core/checked_call.hpp>
#include <chunkwise/core/error.hpp>
#include <chunkwise/testing/atomic_write_faults.hpp>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

namespace chunkwise {

namespace detail {
/// "<call> '<path>' failed: <errno text> (<ENAME>, errno N)"
[[noreturn]] inline void raise_io(const std::string& call, const std::filesystem::path& path, int error_number) {
  throw_posix_failure(call + " '" + path.string() + "'", error_number, {});
}
}  // namespace detail

inline void write_file_atomically(const std::filesystem::path& path, std::string_view contents,
                                  const testing::atomic_write_faults* faults = nullptr) {
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(directory))
    detail::raise(error_code::io_error, "cannot write '" + path.string() + "': directory '" + directory.string() +
                                            "' does not exist");
  const std::filesystem::path temporary = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) detail::raise_io("open", temporary, errno);
  // Every failure from here on removes the temporary file; the target is untouched until the rename.
  const auto fail = [&](const char* call, const std::filesystem::path& named, int error_number, bool open) {
    if (open) ::close(fd);
    ::unlink(temporary.c_str());
    detail::raise_io(call, named, error_number);
  };
  std::size_t written = 0;
  while (written < contents.size()) {
    std::size_t length = contents.size() - written;
    if (faults != nullptr && written + length > faults->write_fails_after) {
      length = faults->write_fails_after - written;  // a partial write, then the injected failure
      if (length == 0) fail("write", temporary, faults->write_error, true);
    }
    const ssize_t n = ::write(fd, contents.data() + written, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write", temporary, n < 0 ? errno : ENOSPC, true);
    written += static_cast<std::size_t>(n);
  }
  int fsync_error = ::fsync(fd) == 0 ? 0 : errno;
  if (faults != nullptr && faults->fsync_error != 0) fsync_error = faults->fsync_error;
  if (fsync_error != 0) fail("fsync", temporary, fsync_error, true);
  if (::close(fd) != 0) fail("close", temporary, errno, false);  // some file systems (NFS) report write errors here
  int rename_error = faults != nullptr ? faults->rename_error : 0;  // an injected failure skips the call
  if (rename_error == 0 && ::rename(temporary.c_str(), path.c_str()) != 0) rename_error = errno;
  if (rename_error != 0) fail("rename", path, rename_error, false);
  if (const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir_fd >= 0) {
    ::fsync(dir_fd);  // best effort: the rename is durable once the directory entry is
    ::close(dir_fd);
  }
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::raise_io("open", path, errno ? errno : ENOENT);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace chunkwise
