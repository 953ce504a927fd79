#!/usr/bin/env bash
# Build llama.cpp's llama-server from the source vendored in the llama-cpp-python sdist (PyPI), once, cached
# under ~/.cache/inferwatch/llamacpp-$VERSION (about 8.5 minutes on 2 cores; ../shared/reference/engines.md §1),
# and write the tiny GGUF the real llama.cpp checks serve. Prints the two paths. Offline after the download:
# no Web UI (LLAMA_USE_PREBUILT_UI=OFF), no TLS, no curl. The binary needs an AVX2 CPU (GGML_NATIVE=OFF).
set -euo pipefail
VERSION="${LLAMACPP_PYTHON_VERSION:-0.3.36}"
CACHE="${HOME}/.cache/inferwatch/llamacpp-${VERSION}"
PY="${PY:-.venv/bin/python}"
BIN="${CACHE}/llama-server"
mkdir -p "${CACHE}"
if [ ! -x "${BIN}" ]; then
  if [ ! -f "${CACHE}/llama_cpp_python-${VERSION}.tar.gz" ]; then
    echo "downloading the llama-cpp-python ${VERSION} sdist (77 MB)" >&2
    "${PY}" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==${VERSION}" -d "${CACHE}"
  fi
  rm -rf "${CACHE}/src"
  mkdir -p "${CACHE}/src"
  tar -xzf "${CACHE}/llama_cpp_python-${VERSION}.tar.gz" -C "${CACHE}/src" --strip-components=1
  SRC="${CACHE}/src/vendor/llama.cpp"
  echo "building llama-server (about 8.5 minutes on 2 cores)" >&2
  started=$(date +%s)
  nice -n 19 cmake -S "${SRC}" -B "${SRC}/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF >"${CACHE}/cmake-configure.log" 2>&1
  nice -n 19 cmake --build "${SRC}/build" --target llama-server -j"$(nproc)" >"${CACHE}/cmake-build.log" 2>&1
  cp "${SRC}/build/bin/llama-server" "${BIN}.tmp" && mv "${BIN}.tmp" "${BIN}"
  echo "built in $(( $(date +%s) - started )) s" >&2
fi
GGUF="${CACHE}/tiny-random.gguf"
if [ ! -f "${GGUF}" ]; then
  PYTHONPATH="${CACHE}/src/vendor/llama.cpp/gguf-py" "${PY}" tests/harness/tiny_gguf.py \
    "${HOME}/.cache/inferwatch/tiny-llm/tokenizer.json" "${GGUF}"
fi
echo "${BIN}"
echo "${GGUF}"
