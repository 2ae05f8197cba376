#pragma once
// pass_guard<Runtime>: holds a pass's chunks acquired for its lifetime (`auto in_use = rt.use(pass);`) and releases
// them at the end of the scope, unless an exception is unwinding: a pass that failed midway has incomplete gradients,
// and releasing it could start a reduction the other ranks never join.
#include <cstddef>
#include <exception>

namespace chunkwise {

template <class Runtime>
class pass_guard {
 public:
  /// After `owner.acquire(pass)`.
  pass_guard(Runtime& owner, std::size_t pass) : owner_(owner), pass_(pass) {}
  pass_guard(const pass_guard&) = delete;
  pass_guard& operator=(const pass_guard&) = delete;
  ~pass_guard() noexcept(false) {
    if (std::uncaught_exceptions() == unwinding_) owner_.release(pass_);
  }

 private:
  Runtime& owner_;
  std::size_t pass_;
  int unwinding_ = std::uncaught_exceptions();
};

}  // namespace chunkwise
