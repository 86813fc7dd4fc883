#!/usr/bin/env python3
"""Runs Verity's math case table through PyPI `math-verify` for a side-by-side comparison.

Usage: python3 verifiers/bench/mathverify_compare.py [--rounds N] [--verity-json bench.json]

Reads verifiers/tests/data/math_cases.tsv (expected<TAB>reference<TAB>response), grades every
case with math_verify.verify(parse(gold), parse(prediction)), and prints JSON: gradings/s,
agreement with the table's labels (Verity's math grader matches all labels; its test suite
asserts that), and the disagreeing cases. With --verity-json (the output of
`verity bench graders`), also the speed ratio.
"""
import argparse
import json
import pathlib
import time

from math_verify import parse, verify

TABLE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "math_cases.tsv"


def load_cases():
    cases = []
    for line in TABLE.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        expected, reference, response = line.split("\t", 2)
        cases.append((expected == "1", reference, response))
    return cases


def completion(response):
    """Same rule as MathCase::completion in Rust: bare answers are boxed."""
    letters = sum(c.isalpha() for c in response)
    full = any(s in response for s in ("\\boxed", "\\fbox", "<answer>", "answer")) or (" " in response and letters > 12)
    return response if full else "\\boxed{" + response + "}"


def gold_text(reference):
    return reference if "\\boxed" in reference or "$" in reference else "$" + reference + "$"


def grade(reference, response):
    try:
        return bool(verify(parse(gold_text(reference)), parse(completion(response))))
    except Exception:  # math-verify raises on some hostile inputs; count as "not equal"
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--verity-json", type=pathlib.Path)
    args = ap.parse_args()
    cases = load_cases()
    verdicts = []
    latencies = []
    started = time.perf_counter()
    for r in range(args.rounds):
        for expected, reference, response in cases:
            t = time.perf_counter()
            v = grade(reference, response)
            latencies.append(time.perf_counter() - t)
            if r == 0:
                verdicts.append(v)
    elapsed = time.perf_counter() - started
    latencies.sort()
    agree = [v == e for v, (e, _, _) in zip(verdicts, cases)]
    report = {
        "math_verify_version": __import__("importlib.metadata").metadata.version("math-verify"),
        "cases": len(cases),
        "rounds": args.rounds,
        "math_verify_gradings_per_s": len(cases) * args.rounds / elapsed,
        "math_verify_median_ms": 1000 * latencies[len(latencies) // 2],
        "math_verify_gradings_per_s_without_slowest_5pct": int(len(latencies) * 0.95)
        / sum(latencies[: int(len(latencies) * 0.95)]),
        "agreement_with_labels": sum(agree) / len(cases),
        "agreement_with_verity": sum(agree) / len(cases),
        "disagreements": [
            {"expected": e, "math_verify": v, "reference": ref, "response": resp}
            for v, (e, ref, resp), ok in zip(verdicts, cases, agree) if not ok
        ],
    }
    if args.verity_json:
        verity = json.loads(args.verity_json.read_text())
        rate = verity["math"]["single_thread_gradings_per_s"]
        report["verity_single_thread_gradings_per_s"] = rate
        report["speed_ratio_verity_over_math_verify"] = rate / report["math_verify_gradings_per_s"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
