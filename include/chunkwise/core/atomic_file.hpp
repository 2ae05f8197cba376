#pragma once
// Files that are either the old version or the new one, never half of each: write a temporary file beside the
// target, fsync it, rename it over the target, fsync the directory.
#include <chunkwise/core/error.hpp>

#include <cerrno>
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
[[noreturn]] inline void raise_io(const std::string& call, const std::filesystem::path& path, int error_number) {
  raise(error_code::io_error, call + " '" + path.string() + "' failed: " + std::strerror(error_number));
}
}  // namespace detail

inline void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(directory))
    detail::raise(error_code::io_error, "cannot write '" + path.string() + "': directory '" + directory.string() +
                                            "' does not exist");
  const std::filesystem::path temporary = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) detail::raise_io("open", temporary, errno);
  std::size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(temporary.c_str());
      detail::raise_io("write", temporary, saved);
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int saved = errno;
    ::close(fd);
    ::unlink(temporary.c_str());
    detail::raise_io("fsync", temporary, saved);
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temporary.c_str());
    detail::raise_io("rename", path, saved);
  }
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
