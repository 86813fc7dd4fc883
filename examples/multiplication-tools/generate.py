#!/usr/bin/env python3
"""Writes the 4-digit multiplication example set with tools: train.jsonl and validation.jsonl.

Deterministic (fixed seed), so the committed files are exactly what this script prints.
Each row asks for a product of two 4-digit numbers (hard for a small model without a tool) and
carries `reference_answer` for the math grader. Run from this folder:  python3 generate.py
"""
import json
import random

SYSTEM = ("You multiply numbers. Use the calculator tool to compute, then reply with the final "
          "number in \\boxed{}.")


def rows(rng: random.Random, count: int, seen: set) -> list:
    out = []
    while len(out) < count:
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        out.append({"messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": f"What is {a} * {b}?"}],
                    "reference_answer": str(a * b)})
    return out


def main() -> None:
    rng = random.Random(25)
    seen: set = set()
    for name, count in [("train.jsonl", 64), ("validation.jsonl", 16)]:
        with open(name, "w") as f:
            for row in rows(rng, count, seen):
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
