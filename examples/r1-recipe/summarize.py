#!/usr/bin/env python3
"""Summarises run.sh's outputs over seeds: pass@1/2/4 of each stage's model as the mean and the
min-max over the seeds, and each recipe's wall time.

Usage: examples/r1-recipe/summarize.py r1-recipe-seed-7 r1-recipe-seed-8 …
(each argument the OUT prefix of one run: PREFIX.csv, the evaluation, and PREFIX.json, the recipe)
"""
import csv
import json
import sys

STAGES = ["base", "1. after cold-start SFT", "2. after RL", "4. fresh base SFT'd on the kept samples"]


def main(prefixes):
    by_stage = {stage: {} for stage in STAGES}
    walls, kept = [], []
    for prefix in prefixes:
        rows = list(csv.DictReader(open(f"{prefix}.csv")))
        for stage, row in zip(STAGES, rows):
            for k in ("pass@1", "pass@2", "pass@4"):
                by_stage[stage].setdefault(k, []).append(float(row[k]))
        recipe = json.load(open(f"{prefix}.json"))
        walls.append(recipe["finished_at"] - recipe["created_at"])
        rs = [s for s in recipe["stages"] if s["name"] == "rs"][0]["summary"]
        kept.append(f"{rs['kept']}/{rs['prompts']}")
    print(f"| model ({len(prefixes)} seeds: mean, min–max) | pass@1 | pass@2 | pass@4 |")
    print("|---|---|---|---|")
    for stage in STAGES:
        cells = []
        for k in ("pass@1", "pass@2", "pass@4"):
            v = by_stage[stage][k]
            cells.append(f"{sum(v) / len(v):.3f} ({min(v):.3f}–{max(v):.3f})")
        print(f"| {stage} | " + " | ".join(cells) + " |")
    print()
    print("wall time per recipe: " + ", ".join(f"{w / 60:.1f} min" for w in walls))
    print("rejection sampling kept (prompts with a kept sample / prompts): " + ", ".join(kept))


if __name__ == "__main__":
    main(sys.argv[1:])
