#!/usr/bin/env bash
# llama.cpp as a peer, in its own venv, built for this CPU with its AMX kernels able to run:
#
#     benchmarks/build_llamacpp.sh /work/llama-venv4          # then --llamacpp-python /work/llama-venv4/bin/python
#
# Why a patch: llama-cpp-python 0.3.36's AMX kernels (ggml-cpu/amx/mmq.cpp) build their tile configuration on the
# stack and hand it to `_tile_loadconfig`, which GCC 12 declares as reading 8 bytes. GCC then drops the stores of
# the rows and column widths as dead, `ldtilecfg` reads stack garbage, and the first batched product faults
# (general protection fault at `ldtilecfg`, or invalid opcode at the next tile instruction, in dmesg). The patch
# passes all 64 bytes as the asm operand; it changes nothing else. Building takes 15-25 minutes on 2 cores.
set -euo pipefail
venv=${1:?usage: build_llamacpp.sh VENV_DIR [VERSION]}
version=${2:-0.3.36}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$venv"
"$venv/bin/pip" download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version"
python3 - "$src/vendor/llama.cpp/ggml/src/ggml-cpu/amx/mmq.cpp" <<'EOF'
import sys

path = sys.argv[1]
text = open(path).read()
old = "_tile_loadconfig(&tc);"
new = ('struct cfg64 { char bytes[64]; }; '
       '__asm__ volatile ("ldtilecfg %0" :: "m" (*reinterpret_cast<const cfg64 *>(&tc)));')
if text.count(old) != 1:
    sys.exit(f"{path}: expected one '{old}' to patch, found {text.count(old)}; this version needs a new patch")
open(path, "w").write(text.replace(old, new))
print(f"patched {path}")
EOF
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CMAKE_ARGS="-DGGML_NATIVE=ON" "$venv/bin/pip" install --no-cache-dir "$src"
echo "llama.cpp ready: --llamacpp-python $venv/bin/python"
