// expect: hybrid<G>: a group has at least one rank
// A hybrid strategy with groups of zero ranks is refused at compile time, naming the rule.
#include <chunkwise/collective/hybrid.hpp>

int main() { return chunkwise::hybrid<0>::group_size; }
