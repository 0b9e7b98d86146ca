#!/usr/bin/env bash
# One command for a person with a GPU: checks frame's GPU plugins natively on this machine's device.
#
#   scripts/gpu_check.sh            # platform from torch (cuda or rocm); PYTHON=... to pick an interpreter
#
# 1. kernel tests, compiled (no interpreter): the triton plugin's whole suite and every `-m gpu` test (among
#    them the platform's CUDA-graph replay against eager decoding); on ROCm also the rocm_aiter plugin against
#    the real AITER;
# 2. end to end: greedy generation on the bundled model with --attn triton and --attn sdpa, same device,
#    through the `frame generate` CLI and through the Python API (token ids compared);
# 3. a micro-benchmark of triton against sdpa attention, printed as a table.
# Exits non-zero when any check fails; the benchmark never fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}
FRAME=${FRAME:-$( [ -x .venv/bin/frame ] && echo .venv/bin/frame || command -v frame || true )}
unset TRITON_INTERPRET
failures=()
step() { echo; echo "=== $* ==="; }

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA or ROCm device is visible to torch ($("$PYTHON" -c 'import torch; print(torch.__version__)')); nothing to check" >&2
    exit 2
fi
PLATFORM=${PLATFORM:-$("$PYTHON" -c "import torch; print('rocm' if torch.version.hip else 'cuda')")}
"$PYTHON" -c "import torch; p = torch.cuda.get_device_properties(0); print(f'device: {p.name}, torch {torch.__version__}, platform $PLATFORM')"

step "1. kernel tests (compiled)"
"$PYTHON" -m pytest plugins/attention/triton -q || failures+=("triton kernel tests")
"$PYTHON" -m pytest -m gpu plugins -q || failures+=("pytest -m gpu")
"$PYTHON" -m pytest "plugins/platforms/$PLATFORM" -q || failures+=("$PLATFORM platform tests")
if [ "$PLATFORM" = rocm ]; then
    "$PYTHON" -m pytest plugins/attention/rocm_aiter -q || failures+=("rocm_aiter tests")
fi

step "2a. end to end through the CLI: --attn triton vs --attn sdpa (float32, greedy, 64 tokens)"
PROMPT="Explain in two sentences why the sky is blue."
if [ -n "$FRAME" ]; then
    out_sdpa=$("$FRAME" generate --prompt "$PROMPT" --attn sdpa --platform "$PLATFORM" --dtype float32 \
               --temperature 0 --max-tokens 64) || failures+=("frame generate --attn sdpa")
    out_triton=$("$FRAME" generate --prompt "$PROMPT" --attn triton --platform "$PLATFORM" --dtype float32 \
                 --temperature 0 --max-tokens 64) || failures+=("frame generate --attn triton")
    printf 'sdpa:   %s\ntriton: %s\n' "$out_sdpa" "$out_triton"
    [ "$out_sdpa" = "$out_triton" ] && echo "same text" || failures+=("CLI greedy text differs")
else
    echo "the frame CLI is not installed; the Python check below covers this step"
fi

step "2b. end to end through frame.LLM: token ids, float32 (must match) and bfloat16 (reported)"
"$PYTHON" scripts/gpu_generate_compare.py --platform "$PLATFORM" --dtype float32 || failures+=("LLM float32 tokens")
"$PYTHON" scripts/gpu_generate_compare.py --platform "$PLATFORM" --dtype bfloat16 || failures+=("LLM bfloat16 run")
if [ "$PLATFORM" = rocm ] && "$PYTHON" -c "import aiter" 2>/dev/null; then
    "$PYTHON" scripts/gpu_generate_compare.py --platform rocm --dtype bfloat16 --backends sdpa,rocm_aiter \
        || failures+=("LLM rocm_aiter run")
fi

step "3. attention micro-benchmark (ms per layer)"
"$PYTHON" scripts/gpu_bench_attention.py --dtype bfloat16 || echo "(benchmark failed; not counted)"

echo
if [ ${#failures[@]} -eq 0 ]; then
    echo "GPU CHECK PASSED on $PLATFORM"
else
    printf 'GPU CHECK FAILED: %s\n' "${failures[@]}"
    exit 1
fi
