#!/usr/bin/env bash
# DeepSpeed's memory and time for llama2-7b on one DGX A100 80 GB: `planner estimate` of each ZeRO stage on one
# stage and on two pipeline stages, then `planner plan` on two clusters. Run from the repository root:
#   bash benchmarks/deepspeed_memory.sh
# Each line: time s, then memory GB per device (per stage); plans: time, ZeRO, micro-batch, stages, (tp, dp,
# recompute) per stage, memory GB per stage.
set -euo pipefail
for args in "--pp 1 --dp 8 --zero 0" "--pp 1 --dp 8 --zero 1" "--pp 1 --dp 8 --zero 2" "--pp 1 --dp 8 --zero 3" "--pp 2 --dp 4 --zero 0" "--pp 2 --dp 4 --zero 1"; do
  printf '%s: ' "$args"
  python -m planner estimate models/llama2-7b.onnx --cluster dgx-a100-80gb --global-batch 64 --tp 1 $args --micro-batch 1 --recompute full --runtime deepspeed --json 2>&1 | python -c "import json,sys; d=json.load(sys.stdin); print(round(d['iteration_time_s'],4), [round(s['memory']['total_bytes']/1e9,1) for s in d['stages']])"
done
for c in dgx-a100-80gb dgx-a100-40gb*2; do
  printf 'plan %s: ' "$c"
  python -m planner plan models/llama2-7b.onnx --cluster "$c" --global-batch 64 --runtime deepspeed --json 2>&1 | python -c "import json,sys; d=json.load(sys.stdin); s=d['stages']; print(round(d['iteration_time_s'],4), 'zero', d['zero'], 'mb', d['micro_batch'], 'pp', len(s), [(x['tp'], x['dp'], x['recompute']) for x in s][:4], [round(x['memory_bytes_per_device']/1e9,1) for x in s][:4])"
done
