#pragma once
// A rendezvous over TCP, for launchers that name one (torchrun's MASTER_ADDR:MASTER_PORT; launcher.hpp): rank 0
// listens and hands a few bytes (an ncclUniqueId) to every other rank, which connects, retrying until rank 0
// listens or the timeout passes. Needs no shared file system (bootstrap_file.hpp does).
//
// The exchange: a rank sends "chunkwise-boot" and its rank (4 bytes, little-endian); rank 0 answers with the same
// tag, the payload's size (8 bytes) and the payload. A peer that is not chunkwise (another service on the port, a
// stale job) is refused by the tag, on both sides. Rank 0 waits for ranks 1 to size - 1, each once; its timeout
// names the ranks that never came.
#include <chunkwise/core/error.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace chunkwise {

namespace detail {

inline constexpr std::array<char, 14> bootstrap_tag{'c', 'h', 'u', 'n', 'k', 'w', 'i',
                                                    's', 'e', '-', 'b', 'o', 'o', 't'};

/// A socket closed when it goes out of scope.
class socket_handle {
 public:
  explicit socket_handle(int fd = -1) noexcept : fd_(fd) {}
  socket_handle(socket_handle&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  socket_handle& operator=(socket_handle&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~socket_handle() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_;
};

/// Milliseconds left until `deadline` (0 when past), for poll().
inline int milliseconds_left(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
}

/// Sends or receives exactly `bytes` bytes before the deadline; false when the peer closed, timed out or failed.
inline bool transfer_all(int fd, std::byte* data, std::size_t bytes, bool send,
                         std::chrono::steady_clock::time_point deadline) {
  std::size_t done = 0;
  while (done < bytes) {
    pollfd waiting{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&waiting, 1, milliseconds_left(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = send ? ::send(fd, data + done, bytes - done, MSG_NOSIGNAL)
                           : ::recv(fd, data + done, bytes - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

inline std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (const int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace detail

/// Rank 0: listens on `port` (every address) and hands `payload` to ranks 1 to ranks - 1. Throws comm_error naming
/// the ranks that did not come within `timeout`, io_error when the port cannot be had.
inline void serve_bootstrap_tcp(int port, std::span<const std::byte> payload, int ranks,
                                std::chrono::milliseconds timeout) {
  using namespace std::chrono;
  const auto deadline = steady_clock::now() + timeout;
  const auto fail_io = [&](const char* call) {
    detail::raise(error_code::io_error, std::string("bootstrap_tcp: ") + call + " on port " + std::to_string(port) +
                                            " failed: " + std::strerror(errno) +
                                            (errno == EADDRINUSE ? " (another job or service holds it: set another "
                                                                   "MASTER_PORT)"
                                                                 : ""));
  };
  detail::socket_handle listener(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  bool ipv6 = listener.get() >= 0;
  if (!ipv6) listener = detail::socket_handle(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) fail_io("socket");
  const int yes = 1, no = 0;
  ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  if (ipv6) ::setsockopt(listener.get(), IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof no);  // IPv4 peers too
  sockaddr_storage address{};
  socklen_t length = 0;
  if (ipv6) {
    auto& a = reinterpret_cast<sockaddr_in6&>(address);
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof a;
  } else {
    auto& a = reinterpret_cast<sockaddr_in&>(address);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof a;
  }
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) fail_io("bind");
  if (::listen(listener.get(), 128) != 0) fail_io("listen");

  std::vector<bool> served(static_cast<std::size_t>(ranks), false);
  served[0] = true;
  int left = ranks - 1;
  while (left > 0) {
    pollfd waiting{listener.get(), POLLIN, 0};
    const int ready = ::poll(&waiting, 1, detail::milliseconds_left(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) fail_io("poll");
    if (ready == 0) {
      std::vector<int> missing;
      for (int r = 1; r < ranks; ++r)
        if (!served[static_cast<std::size_t>(r)]) missing.push_back(r);
      detail::raise(error_code::comm_error,
                    "bootstrap_tcp: rank 0 waited " + std::to_string(timeout.count()) + " ms on port " +
                        std::to_string(port) + " for " + std::to_string(ranks - 1) + " rank(s); " +
                        (missing.size() == 1 ? "rank " : "ranks ") + detail::join_ranks(missing) +
                        " never connected (are they running, with this MASTER_ADDR and MASTER_PORT?)");
    }
    detail::socket_handle peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.get() < 0) continue;  // the peer gave up already; it retries
    std::array<std::byte, detail::bootstrap_tag.size() + 4> hello{};
    if (!detail::transfer_all(peer.get(), hello.data(), hello.size(), false, deadline)) continue;
    if (std::memcmp(hello.data(), detail::bootstrap_tag.data(), detail::bootstrap_tag.size()) != 0) continue;
    std::uint32_t rank = 0;
    for (int i = 3; i >= 0; --i)
      rank = rank << 8 | std::to_integer<std::uint32_t>(hello[detail::bootstrap_tag.size() + i]);
    if (rank == 0 || rank >= static_cast<std::uint32_t>(ranks))
      detail::raise(error_code::comm_error,
                    "bootstrap_tcp: a peer on port " + std::to_string(port) + " says it is rank " + std::to_string(rank) +
                        " of a job of " + std::to_string(ranks) +
                        " ranks; two jobs share this MASTER_PORT, or their sizes differ");
    std::vector<std::byte> answer(detail::bootstrap_tag.size() + 8 + payload.size());
    std::memcpy(answer.data(), detail::bootstrap_tag.data(), detail::bootstrap_tag.size());
    for (int i = 0; i < 8; ++i)
      answer[detail::bootstrap_tag.size() + i] =
          static_cast<std::byte>(static_cast<std::uint64_t>(payload.size()) >> (8 * i));
    std::copy(payload.begin(), payload.end(), answer.begin() + detail::bootstrap_tag.size() + 8);
    if (!detail::transfer_all(peer.get(), answer.data(), answer.size(), true, deadline)) continue;
    if (!served[rank]) {
      served[rank] = true;
      --left;
    }
  }
}

namespace detail {
/// "localhost" (any case, with or without the root's dot) as the loopback address, without the resolver: RFC 6761
/// asks resolvers to answer so, yet one without /etc/hosts (a container's or a chroot's minimal root) does not.
inline std::string loopback_if_localhost(const std::string& address) {
  std::string name = address;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name == "localhost" || name == "localhost." ? "127.0.0.1" : address;
}
}  // namespace detail

/// Ranks 1 to size - 1: connects to rank 0 at address:port, retrying every `retry` until `timeout` (rank 0 may not
/// listen yet), and returns its `bytes` bytes. Throws comm_error naming the address after the timeout, or when the
/// peer is not a chunkwise rank 0 or sends another number of bytes.
inline std::vector<std::byte> fetch_bootstrap_tcp(const std::string& address, int port, int rank, std::size_t bytes,
                                                  std::chrono::milliseconds timeout,
                                                  std::chrono::milliseconds retry = std::chrono::milliseconds(20)) {
  using namespace std::chrono;
  const auto deadline = steady_clock::now() + timeout;
  const std::string where = address + ":" + std::to_string(port);
  std::string last_error = "nothing listened";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int resolved =
        ::getaddrinfo(detail::loopback_if_localhost(address).c_str(), std::to_string(port).c_str(), &hints, &found);
    if (resolved != 0)
      detail::raise(error_code::comm_error,
                    "bootstrap_tcp: cannot resolve MASTER_ADDR '" + address + "': " + ::gai_strerror(resolved));
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      detail::socket_handle s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (s.get() < 0) continue;
      if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      std::array<std::byte, detail::bootstrap_tag.size() + 4> hello{};
      std::memcpy(hello.data(), detail::bootstrap_tag.data(), detail::bootstrap_tag.size());
      for (int i = 0; i < 4; ++i)
        hello[detail::bootstrap_tag.size() + i] = static_cast<std::byte>(static_cast<std::uint32_t>(rank) >> (8 * i));
      std::array<std::byte, detail::bootstrap_tag.size() + 8> header{};
      if (!detail::transfer_all(s.get(), hello.data(), hello.size(), true, deadline) ||
          !detail::transfer_all(s.get(), header.data(), header.size(), false, deadline)) {
        last_error = "the connection closed before rank 0 answered";
        continue;
      }
      if (std::memcmp(header.data(), detail::bootstrap_tag.data(), detail::bootstrap_tag.size()) != 0) {
        ::freeaddrinfo(found);
        detail::raise(error_code::comm_error, "bootstrap_tcp: " + where +
                                                  " answered, but not as a chunkwise rank 0 (another service on "
                                                  "MASTER_PORT?)");
      }
      std::uint64_t size = 0;
      for (int i = 7; i >= 0; --i)
        size = size << 8 | std::to_integer<std::uint64_t>(header[detail::bootstrap_tag.size() + i]);
      if (size != bytes) {
        ::freeaddrinfo(found);
        detail::raise(error_code::comm_error, "bootstrap_tcp: rank 0 at " + where + " sends " + std::to_string(size) +
                                                  " bytes; expected " + std::to_string(bytes) +
                                                  " (another version of the program?)");
      }
      std::vector<std::byte> payload(bytes);
      if (detail::transfer_all(s.get(), payload.data(), bytes, false, deadline)) {
        ::freeaddrinfo(found);
        return payload;
      }
      last_error = "the connection closed in the middle of the payload";
    }
    ::freeaddrinfo(found);
    if (steady_clock::now() + retry >= deadline)
      detail::raise(error_code::comm_error, "bootstrap_tcp: rank " + std::to_string(rank) + " waited " +
                                                std::to_string(timeout.count()) + " ms for rank 0 at " + where + " (" +
                                                last_error + "); check that rank 0 runs and MASTER_ADDR and "
                                                "MASTER_PORT name its machine and a free port");
    std::this_thread::sleep_for(retry);
  }
}

}  // namespace chunkwise
