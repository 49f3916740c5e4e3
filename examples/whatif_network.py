"""What if the network were twice as fast, or we had more nodes? A what-if sweep from the Python API.

    python examples/whatif_network.py [OUT_DIR]

Builds a GPT-2-sized model, re-plans it on 1-4 DGX A100 nodes with 12.5, 25 and 50 GB/s per node, prints the
table and writes whatif_network.csv and whatif_network.png into OUT_DIR (default: the current folder).
"""

from __future__ import annotations

import os
import sys
import tempfile

import planner
from planner.builders import build, save
from planner.report.plots import write_whatif_plot


def main(out_dir: str = ".") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "gpt2.onnx")
        save(build("gpt", {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "seq_len": 1024}), model_path)
        result = planner.whatif(model_path, "dgx-a100-80gb*1", global_batch=512,
                                sweeps={"count": ["1", "2", "4"], "inter_node_bandwidth_GBps": ["12.5", "25", "50"]})
    print(result.to_table())
    with open(os.path.join(out_dir, "whatif_network.csv"), "w") as f:
        f.write(result.to_csv())
    write_whatif_plot(result, os.path.join(out_dir, "whatif_network.png"), x_key="count")


if __name__ == "__main__":
    main(*sys.argv[1:2])
