// expect: cached<Tier>: Tier must be
// A device cache whose home is the device itself is a mistake: the primary template says so and names `resident`.
#include <chunkwise/placement/cached.hpp>

int main() { return static_cast<int>(chunkwise::cached<chunkwise::space::device>::device_bytes(1, 1, 1)); }
