#!/bin/sh
# Sweeps batch size and prompt length against one endpoint and appends to results.csv.
set -eu

ENDPOINT=${ENDPOINT:-http://inference-7.us-east.internal:8000}
OUT=${OUT:-results.csv}
DURATION=${DURATION:-120}
WARMUP=${WARMUP:-20}

[ -f "$OUT" ] || echo "ts,batch,prompt_len,output_len,rps,p50_ms,p90_ms,p99_ms,tokens_per_s" > "$OUT"

for batch in 1 2 4 8 16 32 64 128; do
  for prompt_len in 128 512 2048 8192; do
    output_len=$((prompt_len / 4))
    [ "$output_len" -gt 1024 ] && output_len=1024
    echo ">>> batch=$batch prompt_len=$prompt_len output_len=$output_len"
    loadgen --endpoint "$ENDPOINT" --concurrency "$batch" \
      --prompt-tokens "$prompt_len" --output-tokens "$output_len" \
      --duration "${DURATION}s" --warmup "${WARMUP}s" --format csv --no-header >> "$OUT"
  done
done

# tail -n 6 results.csv
# 1709630000,64,2048,512,21.4,2981,4410,6123,10957.3
# 1709630142,64,8192,1024,6.2,9817,13220,18876,6348.8
# 1709630284,128,128,32,240.7,531,788,1214,7702.4
# 1709630426,128,512,128,118.9,1077,1603,2470,15219.2
# 1709630568,128,2048,512,30.1,4236,6170,8810,15411.2
# 1709630710,128,8192,1024,7.9,16302,21904,30112,8089.6
