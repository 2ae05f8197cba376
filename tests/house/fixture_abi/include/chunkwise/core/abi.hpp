#pragma once
// Fixture: stands in for core/abi.hpp.
