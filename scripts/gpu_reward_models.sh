#!/usr/bin/env bash
# ProgRM's reward-model setting on a GPU: an LLM backbone (LLM + MLP + sigmoid), the whole model
# fine-tuned with Table 5's hyper-parameters under DeepSpeed ZeRO-2 (the deepspeed launcher), then
# every held-out trajectory scored there (training.reward_models.offline score). The scores come
# back to the machine with the warehouse, where `offline report` computes the report's metrics.
#
# Needs: python with torch (CUDA), the project's Python dependencies for training (transformers,
# deepspeed, gguf for a .gguf backbone); no warehouse. Inputs (environment):
#   BACKBONE    a Hugging Face folder, or a .gguf file (dequantised once into $WORK/home)
#   EXAMPLES    folder of rm_examples Parquet files named <kind>.parquet (the reward_model_datasets asset's)
#   EVALSETS    folder that `python -m training.reward_models.offline export` wrote
#   KINDS       kinds to train, in order (default: "orm progrm_lcs")
#   SECONDS_<KIND>  a time budget per kind (default 0: the whole schedule); training then stops
#                   after the first step past it and exports what it has (the summary says so)
#   EPOCHS      epochs (default: Table 5's 3)
#   EXTRA_ARGS  more training arguments (e.g. a slice: --max_train_examples 8 --max_length 256)
#   OUT         where the summaries, scores and logs go
#   WORK        scratch space for checkpoints (default /tmp/stepwise-gpu)
#   DS_CONFIG   DeepSpeed config (default training/ds_zero2.json; training/ds_zero2_cpu.json tries it on a CPU)
set -uo pipefail
: "${BACKBONE:?}" "${EXAMPLES:?}" "${EVALSETS:?}" "${OUT:?}"
KINDS=${KINDS:-"orm progrm_lcs"}
WORK=${WORK:-/tmp/stepwise-gpu}
EPOCHS=${EPOCHS:-3}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, deepspeed; print('torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)" | tee -a "$OUT/gpu.txt"
status=0
train() {  # train KIND [--deepspeed CONFIG]: the deepspeed launcher with a config, else one plain process
  local kind=$1; shift
  local budget_var="SECONDS_${kind^^}"
  local args=(--profile llm --kind "$kind" --backbone "$BACKBONE" --home "$WORK/home"
    --examples "$EXAMPLES/$kind.parquet" --output_dir "$WORK/$kind/trainer" --export_dir "$WORK/$kind/final"
    --num_train_epochs "$EPOCHS" --max_train_seconds "${!budget_var:-0}"
    --eval_strategy no --save_steps 100000 --logging_steps 20 --disable_tqdm true)
  if [ $# -gt 0 ]; then
    python3 -m deepspeed.launcher.runner --num_gpus 1 --module training.reward_models.train "${args[@]}" "$@" ${EXTRA_ARGS:-}
  else
    python3 -m training.reward_models.train "${args[@]}" ${EXTRA_ARGS:-}
  fi
}
status=0
for kind in $KINDS; do
  started=$(date +%s)
  train "$kind" --deepspeed "${DS_CONFIG:-training/ds_zero2.json}" > "$OUT/train_$kind.log" 2>&1
  rc=$?
  echo "train $kind under DeepSpeed: exit $rc after $(( $(date +%s) - started )) s" | tee -a "$OUT/gpu.txt"
  tail -n 5 "$OUT/train_$kind.log"
  if [ $rc -ne 0 ]; then  # the DeepSpeed path failed: the same training in one plain process, said so
    rm -rf "${WORK:?}/$kind"
    started=$(date +%s)
    train "$kind" > "$OUT/train_${kind}_plain.log" 2>&1
    rc=$?
    echo "train $kind without DeepSpeed: exit $rc after $(( $(date +%s) - started )) s" | tee -a "$OUT/gpu.txt"
    tail -n 5 "$OUT/train_${kind}_plain.log"
  fi
  if [ $rc -ne 0 ]; then status=1; continue; fi
  cp "$WORK/$kind/trainer/training_summary.json" "$OUT/summary_$kind.json"
  started=$(date +%s)
  python3 -m training.reward_models.offline score --checkpoint "$WORK/$kind/final" --trajectories "$EVALSETS" \
    --out "$OUT/scores_$kind.json" 2>&1 | tail -n 3 || status=1
  echo "score $kind: $(( $(date +%s) - started )) s" | tee -a "$OUT/gpu.txt"
done
exit $status
