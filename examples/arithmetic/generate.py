#!/usr/bin/env python3
"""Writes the arithmetic example set: train.jsonl and validation.jsonl.

Deterministic (fixed seed), so the committed files are exactly what this script prints.
Each row is a one-step integer word problem (or a bare sum) and carries `reference_answer` for the math grader.
Run from this folder:  python3 generate.py
"""
import json
import random

SYSTEM = "You solve short arithmetic word problems. Reply with the final number in \\boxed{}."


NAMES = ["Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Liam"]
THINGS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards"]


def question(rng: random.Random) -> tuple[str, int]:
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    kind = rng.choice(["add", "add", "sub", "sub", "mul", "expr"])
    if kind == "add":
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        return f"{name} has {a} {thing}. {other} gives {name} {b} more. How many {thing} does {name} have now?", a + b
    if kind == "sub":
        a = rng.randint(10, 80)
        b = rng.randint(1, a - 1)
        return f"{name} has {a} {thing} and gives {b} of them to {other}. How many {thing} does {name} have left?", a - b
    if kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        return f"{name} has {a} boxes with {b} {thing} in each box. How many {thing} does {name} have in all?", a * b
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    return f"What is {a} + {b}?", a + b


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
