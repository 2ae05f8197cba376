#!/usr/bin/env bash
# Prints a fingerprint of the sources a build of run.sh's targets is made from (the CMake files and the C++/CUDA
# sources and headers, by content). prepare.sh stamps its carried build with it; run.sh uses that build only where
# the sources it was given have the same fingerprint, so a build carried from older sources is never what it times.
set -euo pipefail
cd "$(dirname "$0")/../.."
find CMakeLists.txt cmake include examples tests bench/device -type f \( -name '*.hpp' -o -name '*.h' -o -name '*.cpp' \
  -o -name '*.cu' -o -name '*.cuh' -o -name '*.cmake' -o -name 'CMakeLists.txt' -o -name '*.in' \) -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
