#!/usr/bin/env python3
"""Writes the code example set: train.jsonl and validation.jsonl.

Deterministic (fixed seed), so the committed files are exactly what this script prints.
Each row asks for one short Python function — ten families of small tasks (arithmetic on a
number, strings, lists), 32 rows each, every row with its own constants — and carries `tests`
(assert statements for the `code` grader, computed here by running the reference solution on
inputs chosen so that a constant or a near-miss answer fails) and `reference_solution` (a test
runs it through the real sandbox). Run from this folder:  python3 generate.py
"""
import json
import random
import string

SYSTEM = "You write short Python functions. Reply with the function in one ```python code block."
PER_FAMILY = 32
LETTERS = string.ascii_lowercase
SEPARATORS = {"": "with nothing between them", " ": "separated by single spaces",
              "-": "separated by '-'", ",": "separated by ','"}


def linear(k, m):
    return (f"Write a Python function `f(x)` that returns {k} times x plus {m}.",
            f"def f(x):\n    return {k} * x + {m}", ["0", "3", "-2", "10"])


def divisible(k):
    return (f"Write a Python function `is_multiple(n)` that returns True when n is divisible by {k} and False otherwise.",
            f"def is_multiple(n):\n    return n % {k} == 0", [str(k), str(k * 3), str(k + 1), "0", str(k * 5 - 1)])


def count_char(c, ignore_case):
    words = [repr(c + "x" + c + "y"), repr("zz" + c.upper()), repr(c), "''"]
    if ignore_case:
        return (f"Write a Python function `count_char(s)` that returns how many times the letter '{c}' occurs in the string s, counting upper and lower case alike.",
                f"def count_char(s):\n    return s.lower().count('{c}')", words)
    return (f"Write a Python function `count_char(s)` that returns how many times the lower-case letter '{c}' occurs in the string s.",
            f"def count_char(s):\n    return s.count('{c}')", words)


def repeat(k, sep):
    return (f"Write a Python function `repeat(s)` that returns the string s repeated {k} times, {SEPARATORS[sep]}.",
            f"def repeat(s):\n    return {sep!r}.join([s] * {k})", ["'ab'", "'x'", "''"])


def text_slice(k, end, upper):
    part = "last" if end else "first"
    case = " in upper case" if upper else ""
    body = f"s[-{k}:]" if end else f"s[:{k}]"
    body = f"{body}.upper()" if upper else body
    return (f"Write a Python function `part(s)` that returns the {part} {k} characters of the string s{case}.",
            f"def part(s):\n    return {body}", ["'watermelon'", "'kiwi'", "'abcdefghij'"])


def list_slice(k, end, reverse):
    part = "last" if end else "first"
    order = " in reverse order" if reverse else ""
    body = f"xs[-{k}:]" if end else f"xs[:{k}]"
    body = f"{body}[::-1]" if reverse else body
    return (f"Write a Python function `pick(xs)` that returns a list of the {part} {k} elements of the list xs{order}.",
            f"def pick(xs):\n    return {body}", ["[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", "[7, 3]", "[]"])


def scale(k):
    return (f"Write a Python function `scale(xs)` that returns a new list with every number in the list xs multiplied by {k}.",
            f"def scale(xs):\n    return [x * {k} for x in xs]", ["[1, 5, -2]", "[0]", "[]"])


def sum_above(t):
    return (f"Write a Python function `sum_above(xs)` that returns the sum of the numbers in the list xs that are greater than {t}.",
            f"def sum_above(xs):\n    return sum(x for x in xs if x > {t})", [repr([t - 1, t, t + 1, t + 5]), repr([t + 2, t - 9]), "[]"])


def clamp(lo, hi):
    return (f"Write a Python function `clamp(x)` that returns {lo} if x is less than {lo}, {hi} if x is greater than {hi}, and x otherwise.",
            f"def clamp(x):\n    return max({lo}, min({hi}, x))", [str(lo - 3), str(hi + 2), str(lo + 1), str(hi)])


def affix(c, end):
    which = "ends" if end else "starts"
    method = "endswith" if end else "startswith"
    return (f"Write a Python function `check(s)` that returns True when the string s {which} with the letter '{c}' and False otherwise.",
            f"def check(s):\n    return s.{method}('{c}')", [repr(c + "ab" + c), repr("zz"), repr(c), "''", repr("b" + c + "b")])


FAMILIES = [
    [linear(k, m) for k in range(2, 13) for m in range(1, 31)],
    [divisible(k) for k in range(2, 51)],
    [count_char(c, i) for c in LETTERS for i in (False, True)],
    [repeat(k, s) for k in range(2, 10) for s in SEPARATORS],
    [text_slice(k, e, u) for k in range(1, 9) for e in (False, True) for u in (False, True)],
    [list_slice(k, e, r) for k in range(1, 9) for e in (False, True) for r in (False, True)],
    [scale(k) for k in range(2, 51)],
    [sum_above(t) for t in range(-5, 41)],
    [clamp(lo, lo + w) for lo in range(0, 21) for w in range(3, 16)],
    [affix(c, e) for c in LETTERS for e in (False, True)],
]


def tests(solution: str, args: list[str]) -> str:
    """assert lines checking the solution's function on each argument against its own value."""
    scope: dict = {}
    exec(solution, scope)
    name = solution.split("(")[0].removeprefix("def ")
    return "\n".join(f"assert {name}({a}) == {scope[name](eval(a))!r}" for a in args)


def row(request: str, solution: str, args: list[str]) -> dict:
    return {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}],
        "tests": tests(solution, args),
        "reference_solution": solution,
    }


def write(path: str, items: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    rng = random.Random(20261206)
    drawn = [row(*task) for family in FAMILIES for task in rng.sample(family, PER_FAMILY)]
    rng.shuffle(drawn)
    write("validation.jsonl", drawn[:64])  # held out: no training row repeats a request
    write("train.jsonl", drawn[64:])
