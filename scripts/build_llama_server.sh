#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` from the source that the pinned llama-cpp-python vendors,
# so that the server comparison runs the same llama.cpp as the speed yardstick, built with the same
# flags (scripts/llamacpp_flags.sh). The binary lands
# in $SPECWISE_HOME/llama-server/ (as specwise's cache: default ~/.cache/specwise); 5-15 minutes on 2 cores.
# Safe to run again: a binary built from the same version with the same flags is kept.
set -euo pipefail
version=0.3.36
home=${SPECWISE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/specwise}
dest="$home/llama-server"
python=${PYTHON:-python3}
cmake_args=$(bash "$(dirname "$0")/llamacpp_flags.sh")
# What the binary was built from and with, read by every result that names it (scripts/server_compare.py).
build=$("$python" -c 'import json, sys; print(json.dumps({"package": "llama-server", "source": "llama-cpp-python "
    + sys.argv[1], "version": sys.argv[1], "cmake_args": sys.argv[2], "compiler": sys.argv[3]}))' \
    "$version" "$cmake_args" "$(c++ --version 2>/dev/null | head -1)")
if [ -x "$dest/llama-server" ] && [ "$(cat "$dest/BUILD" 2>/dev/null)" = "$build" ]; then
    echo "llama-server $version already built with these flags: $dest/llama-server"; exit 0
fi
for tool in cmake g++; do
    command -v "$tool" >/dev/null || { echo "building llama-server needs $tool (apt install cmake g++)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$version"
tar -xzf "$work"/llama_cpp_python-$version.tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# shellcheck disable=SC2086
cmake -S "$src" -B "$work/build" "${generator[@]}" $cmake_args \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$work/cmake.log"
cmake --build "$work/build" --target llama-server -j "$(nproc)"
mkdir -p "$dest"
cp "$work/build/bin/llama-server" "$dest/llama-server"
echo "$version" >"$dest/VERSION"
echo "$build" >"$dest/BUILD"
echo "built $dest/llama-server (llama.cpp from llama-cpp-python $version)"
