#!/usr/bin/env bash
# Rebuilds the bundled sample graphs (no weight data) with `planner models build`.
set -euo pipefail
cd "$(dirname "$0")"
planner() { python -m planner "$@"; }
planner models build gpt --set layers=12 --set hidden=768 --set heads=12 --set vocab=50257 --set seq_len=1024 --out gpt2-124m.onnx
planner models build gpt --set layers=24 --set hidden=2048 --set heads=16 --set vocab=51200 --set seq_len=2048 --out gpt-1.3b.onnx
planner models build gpt --set layers=96 --set hidden=12288 --set heads=96 --set vocab=51200 --set seq_len=2048 --out gpt3-175b.onnx
planner models build llama --out llama2-7b.onnx
planner models build bert --out bert-base.onnx
python - <<'PY'
import json
ref = json.load(open("../benchmarks/data/embedding_workloads.json"))
crit = next(w for w in ref["workloads"] if w["name"] == "criteo-kaggle-dlrm")
json.dump({"tables": crit["tables"]}, open("criteo-tables.json", "w"), indent=1)
PY
planner models build dlrm --set tables=criteo-tables.json --set dense_features=13 --set bottom_mlp=512,256,64 --set top_mlp=512,256,1 --out dlrm-criteo.onnx
