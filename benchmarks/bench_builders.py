"""How long `planner models build` takes and how big the files are, from GPT-3 125M to a 1T GPT.

    python benchmarks/bench_builders.py            # prints a Markdown table

Each size is built (planner.builders.build), saved to a temporary folder and imported back
(planner.graph.load_model, seq = 2048); times are the best of 3 on this machine.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from planner.builders import build, save  # noqa: E402
from planner.graph import load_model  # noqa: E402

SIZES = {"125M": (12, 768, 12), "1.3B": (24, 2048, 16), "13B": (40, 5120, 40), "175B": (96, 12288, 96),
         "1T": (128, 25600, 160)}


def best_of(n: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(n):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    print("| model | params | build s | file KB | import s |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, (layers, hidden, heads) in SIZES.items():
            settings = {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 51200, "seq_len": 2048}
            build_s, model = best_of(3, lambda: build("gpt", settings, weights_file="gpt.weights"))
            path = os.path.join(folder, "gpt.onnx")
            save(model, path)
            import_s, graph = best_of(3, lambda: load_model(path, dims={"batch": 1, "seq": 2048}))
            print(f"| gpt {name} | {graph.params:,} | {build_s:.3f} | {os.path.getsize(path) / 1e3:.0f} | "
                  f"{import_s:.2f} |")


if __name__ == "__main__":
    main()
