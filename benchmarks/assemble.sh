#!/usr/bin/env bash
# Writes BENCHMARKS.md from the per-area results in benchmarks/results/ (each written by its benchmark's author
# with the date, command and numbers of the run).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Benchmarks"
  echo
  echo "Every number below was measured on the 2-core, no-GPU development machine on the date its section gives,"
  echo "with the command it names; times in plans are the cost model's predictions unless a section says measured."
  echo "Sections: $(ls benchmarks/results/*.md | xargs -n1 basename | sed 's/\.md$//' | paste -sd, - | sed 's/,/, /g')."
  for area in graph builders hardware cost search embeddings export whatif catalog showcase context moe identity; do
    f="benchmarks/results/$area.md"
    [ -f "$f" ] || continue
    echo
    echo "---"
    echo
    cat "$f"
  done
} > BENCHMARKS.md
