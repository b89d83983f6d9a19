#!/usr/bin/env bash
# Build llama.cpp's CLI tools (llama-bench, llama-quantize, llama-completion, llama-tokenize) from the llama.cpp
# vendored in the PyPI source package of llama-cpp-python. Idempotent.
set -euo pipefail
W=${PEERS_WORK:-/tmp/peers}
mkdir -p "$W/sdist"
cd "$W"

# 1. Fetch the sdist. NOTE: `--no-binary :all:` also forces pip to build the
#    *build* dependencies (cmake, ninja) from source while preparing metadata,
#    which took >10 min on 2 cores before we killed it. Restricting no-binary to
#    llama-cpp-python itself downloads the same sdist (it ships no wheels anyway).
if ! ls sdist/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
  pip download --no-deps --no-binary llama-cpp-python llama-cpp-python -d sdist
fi
TGZ=$(ls sdist/llama_cpp_python-*.tar.gz | sort -V | tail -1)
SRC=$W/$(basename "$TGZ" .tar.gz)
[ -d "$SRC" ] || tar -xzf "$TGZ" -C "$W"
LC=$SRC/vendor/llama.cpp
ln -sfn "$LC" "$W/llama.cpp"

# 2. Record version info found in the sdist (no .git in an sdist, so the
#    llama.cpp commit is not recoverable; the build reports "unknown").
{
  echo "sdist: $(basename "$TGZ")"
  echo "llama-cpp-python: $(grep -m1 '^Version:' "$SRC/PKG-INFO" | cut -d' ' -f2)"
  echo "vendor/llama.cpp/.git: $(cat "$LC/.git" 2>/dev/null || echo none)"
  echo "sha256(sdist): $(sha256sum "$TGZ" | cut -d' ' -f1)"
} > "$W/llama-version.txt"

# 3. Build.
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
# This VM's CPU advertises AMX (amx_tile/amx_int8/amx_bf16 in /proc/cpuinfo) but
# executing it faults: a -march=native build dies with SIGILL at `tilezero %tmm4`
# in tinygemm_kernel_amx<block_q8_0> (ggml's AMX backend) on the first Q8_0
# matmul. So keep -march=native but compile the AMX extensions out.
NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if ! grep -q -- "-mno-amx-tile" "$LC/build/CMakeCache.txt" 2>/dev/null; then
  cmake -S "$LC" -B "$LC/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX"
fi
cmake --build "$LC/build" --target llama-bench llama-quantize llama-completion llama-tokenize -j2   # incremental; no-op when up to date
"$LC/build/bin/llama-bench" --version 2>&1 | tee -a "$W/llama-version.txt" || true
cat "$W/llama-version.txt"
