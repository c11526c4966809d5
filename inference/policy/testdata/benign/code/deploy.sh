#!/usr/bin/env bash
# Rolls a new model server image out to the staging pool, one replica at a time.
set -euo pipefail

IMAGE="registry.example.com/inference/vllm-server:0.5.0-cu121"
NAMESPACE="staging"
POOL="llama-3-8b"
REPLICAS=4
PORT=8000
HEALTH_TIMEOUT=600      # seconds; a 16 GB checkpoint takes about 240 s to load
MAX_UNAVAILABLE=1
GPU_MEMORY_UTILIZATION=0.92
MAX_MODEL_LEN=8192
MAX_NUM_SEQS=256
MAX_NUM_BATCHED_TOKENS=16384
BLOCK_SIZE=16
SWAP_SPACE_GIB=4

log() { printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }

for i in $(seq 0 $((REPLICAS - 1))); do
  pod="${POOL}-${i}"
  log "updating ${pod} (${i}/${REPLICAS})"
  kubectl -n "$NAMESPACE" set image "statefulset/${POOL}" server="$IMAGE"
  kubectl -n "$NAMESPACE" delete pod "$pod" --wait=true --timeout=120s
  start=$(date +%s)
  until kubectl -n "$NAMESPACE" exec "$pod" -- curl -fsS "http://localhost:${PORT}/health" >/dev/null 2>&1; do
    if (( $(date +%s) - start > HEALTH_TIMEOUT )); then
      log "timed out after ${HEALTH_TIMEOUT}s waiting for ${pod}"
      exit 1
    fi
    sleep 5
  done
  log "${pod} healthy after $(( $(date +%s) - start ))s"
done

log "args: --gpu-memory-utilization ${GPU_MEMORY_UTILIZATION} --max-model-len ${MAX_MODEL_LEN} --max-num-seqs ${MAX_NUM_SEQS} --max-num-batched-tokens ${MAX_NUM_BATCHED_TOKENS} --block-size ${BLOCK_SIZE} --swap-space ${SWAP_SPACE_GIB}"

# Example run:
# 2024-03-05T09:12:44Z updating llama-3-8b-0 (0/4)
# 2024-03-05T09:16:31Z llama-3-8b-0 healthy after 221s
# 2024-03-05T09:16:31Z updating llama-3-8b-1 (1/4)
# 2024-03-05T09:20:09Z llama-3-8b-1 healthy after 209s
# 2024-03-05T09:20:09Z updating llama-3-8b-2 (2/4)
# 2024-03-05T09:24:02Z llama-3-8b-2 healthy after 226s
# 2024-03-05T09:24:02Z updating llama-3-8b-3 (3/4)
# 2024-03-05T09:27:48Z llama-3-8b-3 healthy after 217s
