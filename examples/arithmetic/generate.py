#!/usr/bin/env python3
"""Writes the arithmetic example set: train.jsonl and validation.jsonl.

Deterministic (fixed seed), so the committed files are exactly what this script prints.
Each row asks one small integer question and carries `reference_answer` for the math grader.
Run from this folder:  python3 generate.py
"""
import json
import random

SYSTEM = "You are a careful calculator. Reply with the result in \\boxed{}."


def question(rng: random.Random) -> tuple[str, int]:
    kind = rng.choice(["add", "add", "sub", "mul"])
    if kind == "add":
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        return f"What is {a} + {b}?", a + b
    if kind == "sub":
        a = rng.randint(10, 80)
        b = rng.randint(1, a)
        return f"What is {a} - {b}?", a - b
    a, b = rng.randint(2, 12), rng.randint(2, 9)
    return f"What is {a} * {b}?", a * b


def rows(rng: random.Random, count: int, seen: set[str]) -> list[dict]:
    out = []
    while len(out) < count:
        text, answer = question(rng)
        if text in seen:
            continue
        seen.add(text)
        out.append({
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{text} Put the final answer in \\boxed{{}}."},
            ],
            "reference_answer": str(answer),
        })
    return out


def write(path: str, items: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    rng = random.Random(20261129)
    seen: set[str] = set()
    validation = rows(rng, 64, seen)  # drawn first, so the training rows never repeat them
    train = rows(rng, 512, seen)
    write("train.jsonl", train)
    write("validation.jsonl", validation)
