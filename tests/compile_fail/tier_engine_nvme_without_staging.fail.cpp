// expect: a file-backed home needs a host-accessible staging tier
// NVMe <-> device moves go through pinned staging: an engine over an NVMe home must name a pinned staging tier.
#include <chunkwise/backend/host.hpp>
#include <chunkwise/tier/nvme.hpp>
#include <chunkwise/tier/transfer_engine.hpp>

int main() {
  chunkwise::transfer_engine<chunkwise::host_backend, chunkwise::nvme_tier>* engine = nullptr;
  return engine != nullptr && engine->staged;
}
