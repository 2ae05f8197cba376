// expect: reducible_element
// Reductions take float, bf16 and fp16 only: an int all-reduce does not satisfy the constraint.
#include <chunkwise/comm/thread_comm.hpp>

#include <span>

int main() {
  chunkwise::thread_world world(1);
  auto comm = world.comm(0);
  int value = 1;
  comm.all_reduce(std::span<const int>(&value, 1), std::span<int>(&value, 1), chunkwise::reduce_op::sum).wait();
}
