#!/usr/bin/env bash
# Builds ggml's CPU backend (static, -march=native, no OpenMP) for scripts/peer-ggml.
# Usage: scripts/peer-ggml/build-ggml.sh GGML_SRC BUILD_DIR
# GGML_SRC is a checkout of https://github.com/ggml-org/ggml (outside this repository); then
#   cd scripts/peer-ggml && GGML_SRC=... GGML_DIR=BUILD_DIR cargo run --release
# OpenMP is off so that ggml uses its own thread pool, which the harness pauses while
# moshi-kernels's team runs (an OpenMP team would keep spinning between products). LLAMAFILE is
# on, as llama.cpp builds ggml: its tinyBLAS takes the un-repacked q4_0/q8_0 products at M >= 2.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 GGML_SRC BUILD_DIR (GGML_SRC: a ggml source tree with CMakeLists.txt)" >&2
    exit 2
fi
src=$1
build=$2
if [ ! -f "$src/CMakeLists.txt" ] || [ ! -f "$src/include/ggml.h" ]; then
    echo "$0: $src is not a ggml source tree (expected CMakeLists.txt and include/ggml.h)" >&2
    exit 1
fi
command -v cmake >/dev/null || { echo "$0: cmake not found (apt-get install cmake)" >&2; exit 1; }
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DGGML_BACKEND_DL=OFF -DGGML_OPENMP=OFF -DGGML_LLAMAFILE=ON \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
cmake --build "$build" -j "$(nproc)"
echo "built; now: cd scripts/peer-ggml && GGML_SRC=$src GGML_DIR=$build cargo run --release"
