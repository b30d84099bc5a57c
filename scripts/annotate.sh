#!/usr/bin/env bash
# `make annotate`: Label Studio for annotators, plus the Dagster UI and daemon (which runs the
# label_studio_sync sensor), all bound to 127.0.0.1. Prints where an annotator logs in.
#
#   LABEL_STUDIO_URL + LABEL_STUDIO_API_KEY set  -> your own Label Studio is used (nothing started for it)
#   otherwise                                    -> the project's own server, data in $STEPWISE_HOME/labelstudio
#
# Work is queued with one command, `stepwise annotate push` (the banner prints it with this
# STEPWISE_HOME). Ctrl-C stops what this script started (Label Studio too, unless it was already
# running or KEEP_LABEL_STUDIO=1). ANNOTATE_SMOKE=1 starts everything, checks it answers, and stops
# again; ANNOTATE_BANNER_ONLY=1 prints the banner for a server that is already running, starting nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PY")
STEPWISE_HOME=${STEPWISE_HOME:-$PWD/.stepwise}
mkdir -p "$STEPWISE_HOME"
STEPWISE_HOME=$(cd "$STEPWISE_HOME" && pwd)  # absolute, so the printed commands work from anywhere
export STEPWISE_HOME
export DAGSTER_HOME=${DAGSTER_HOME:-$STEPWISE_HOME/dagster}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
DAGSTER_PORT=${PORT:-3000}

banner() {
  "$PY" -m annotation.labelstudio.banner --home "$STEPWISE_HOME" --url "$1" --dagster-port "$DAGSTER_PORT" --bin "$BIN"
}

if [ "${ANNOTATE_BANNER_ONLY:-0}" = 1 ]; then
  if [ -n "${LABEL_STUDIO_URL:-}" ] && [ -n "${LABEL_STUDIO_API_KEY:-}" ]; then
    banner "$LABEL_STUDIO_URL"
  else
    banner "$("$PY" -m annotation.labelstudio url --home "$STEPWISE_HOME" || echo "http://127.0.0.1:8080")"
  fi
  exit 0
fi

mkdir -p "$DAGSTER_HOME"
cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"

started_ls=0
pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "$started_ls" = 1 ] && [ "${KEEP_LABEL_STUDIO:-0}" != 1 ]; then
    "$PY" -m annotation.labelstudio stop --home "$STEPWISE_HOME" || true
  fi
}
trap cleanup EXIT INT TERM

if [ -n "${LABEL_STUDIO_URL:-}" ] && [ -n "${LABEL_STUDIO_API_KEY:-}" ]; then
  LS_URL=$LABEL_STUDIO_URL
  "$PY" - <<'EOF'
import sys
from annotation.labelstudio.client import LabelStudioClient, LabelStudioError
from annotation.labelstudio.secrets import credentials_from_environment
try:
    user = LabelStudioClient(credentials_from_environment()).whoami()
except LabelStudioError as exc:
    sys.exit(f"[annotate] {exc}")
print(f"[annotate] using your Label Studio as {user['email']}")
EOF
else
  if ! "$PY" -m annotation.labelstudio status --home "$STEPWISE_HOME" >/dev/null 2>&1; then
    started_ls=1
  fi
  "$PY" -m annotation.labelstudio start --home "$STEPWISE_HOME"
  LS_URL=$("$PY" -m annotation.labelstudio url --home "$STEPWISE_HOME")
fi

mkdir -p "$STEPWISE_HOME/logs"
"$BIN/dagster-webserver" -h 127.0.0.1 -p "$DAGSTER_PORT" -w workspace.yaml >"$STEPWISE_HOME/logs/dagster-webserver.log" 2>&1 &
pids+=($!)
"$BIN/dagster-daemon" run -w workspace.yaml >"$STEPWISE_HOME/logs/dagster-daemon.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 90); do
  if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$DAGSTER_PORT/server_info', timeout=2)" 2>/dev/null; then
    break
  fi
  sleep 1
done

banner "$LS_URL"

if [ "${ANNOTATE_SMOKE:-0}" = 1 ]; then
  "$PY" -c "import urllib.request; urllib.request.urlopen('$LS_URL/health', timeout=5); urllib.request.urlopen('http://127.0.0.1:$DAGSTER_PORT/server_info', timeout=5)"
  echo "[annotate] smoke check passed"
  exit 0
fi
wait
