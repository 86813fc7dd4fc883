#!/usr/bin/env python3
"""Writes the multi-step example set: train.jsonl and validation.jsonl.

Deterministic (fixed seed), so the committed files are exactly what this script prints.
Each row is a two-step integer word problem (or a bare two-operation expression) with small
numbers and carries `reference_answer` for the math grader. Run from this folder:
python3 generate.py
"""
import json
import random

SYSTEM = "You solve arithmetic word problems step by step. Reply with the final number in \\boxed{}."

NAMES = ["Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Liam"]
THINGS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards"]


def question(rng: random.Random) -> tuple[str, int]:
    name, other, third = rng.sample(NAMES, 3)
    thing = rng.choice(THINGS)
    kind = rng.choice(["add_sub", "add_sub", "mul_add", "mul_sub", "add_mul", "sub_sub", "expr"])
    if kind == "add_sub":
        a, b = rng.randint(3, 30), rng.randint(2, 20)
        c = rng.randint(1, a + b - 1)
        return (f"{name} has {a} {thing}. {other} gives {name} {b} more, and then {name} gives {c} "
                f"to {third}. How many {thing} does {name} have now?"), a + b - c
    if kind == "mul_add":
        a, b, c = rng.randint(2, 6), rng.randint(2, 10), rng.randint(1, 20)
        return (f"{name} has {c} {thing} and buys {a} boxes with {b} {thing} in each box. "
                f"How many {thing} does {name} have in all?"), a * b + c
    if kind == "mul_sub":
        a, b = rng.randint(2, 6), rng.randint(2, 10)
        c = rng.randint(1, a * b - 1)
        return (f"{name} has {a} bags with {b} {thing} in each bag and gives {c} {thing} to {other}. "
                f"How many {thing} does {name} have left?"), a * b - c
    if kind == "add_mul":
        a, b, c = rng.randint(1, 5), rng.randint(1, 5), rng.randint(2, 9)
        return (f"{name} has {a} boxes and {other} has {b} boxes. Every box holds {c} {thing}. "
                f"How many {thing} do they have together?"), (a + b) * c
    if kind == "sub_sub":
        a = rng.randint(12, 50)
        b = rng.randint(1, a // 2)
        c = rng.randint(1, a - b - 1)
        return (f"{name} has {a} {thing}, gives {b} to {other} and {c} to {third}. "
                f"How many {thing} does {name} have left?"), a - b - c
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 30)
    return f"What is {a} * {b} + {c}?", a * b + c


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
    rng = random.Random(20261206)
    seen: set[str] = set()
    validation = rows(rng, 64, seen)  # drawn first, so the training rows never repeat them
    train = rows(rng, 512, seen)
    write("train.jsonl", train)
    write("validation.jsonl", validation)
