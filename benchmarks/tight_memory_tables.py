"""Write a seeded set of embedding tables that fills most of a large cluster's memory, for timing `planner plan`
where memory is tight (benchmarks/results/embeddings.md).

Unlike benchmarks/embedding_generated.py, which clips each set to half the cluster's device memory, nothing is
clipped: rows log-uniform in [10, 1e9], dims from {16, 32, ..., 512}, pooling factors log-uniform in [1, 200].
The default (5,000 tables, seed 1) needs about 190 TB with SGD, more than the HBM of 1,024 H100s, so host memory
takes part:

    python benchmarks/tight_memory_tables.py --out /tmp/tight.json
    planner plan models/dlrm-criteo.onnx --tables /tmp/tight.json --cluster 'dgx-h100*128' \\
        --global-batch 65536 --optimizer sgd --out /tmp/tight_plan.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def tables(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"name": f"t{i}", "rows": int(10 ** rng.uniform(1, 9)), "dim": int(rng.choice([16, 32, 64, 128, 256, 512])),
             "pooling_factor": float(10 ** rng.uniform(0, 2.3))} for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the tables file to write (JSON)")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"tables": tables(args.count, args.seed)}, handle)


if __name__ == "__main__":
    main()
