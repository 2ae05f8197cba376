#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <chunkwise/core/error.hpp>
#include <doctest/doctest.h>

// chunkwise::out_of_memory is both a chunkwise::error and a std::bad_alloc, so doctest's own `catch (std::exception&)`
// cannot take it (two std::exception bases): give doctest every chunkwise error's message.
REGISTER_EXCEPTION_TRANSLATOR(const chunkwise::error& e) { return doctest::String(e.what()); }
