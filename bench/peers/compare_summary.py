"""Medians and ratios of a compare.sh run: python compare_summary.py results.txt -> a Markdown table.

Each line of results.txt is `NAME {json}`; a measurement repeated over rounds is summarised by
the median of its rounds (each round's own figure is already a median where the bench repeats).
Ratios are Verity / peer: below 1 means Verity takes less time, above 1 more tokens per second.
"""
import json, statistics, sys
from collections import defaultdict

runs = defaultdict(list)
for line in open(sys.argv[1]):
    name, _, payload = line.strip().partition(" ")
    if payload:
        runs[name].append(json.loads(payload))


def med(name, get):
    values = []
    for r in runs.get(name, []):
        try:
            values.append(float(get(r)))
        except (KeyError, TypeError, ValueError):
            pass
    return (statistics.median(values), values) if values else (None, [])


def fmt(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def row(what, ours, theirs, peer, unit, higher_is_better, words=("faster", "slower")):
    (v, vs), (p, ps) = ours, theirs
    ratio = None if v is None or p is None else v / p
    better = "" if ratio is None or not words else words[(ratio > 1) != higher_is_better]
    spread = lambda xs: "" if len(xs) < 2 else f" ({fmt(min(xs))}–{fmt(max(xs))})"
    print(f"| {what} | {fmt(v)}{spread(vs)} {unit} | {peer}: {fmt(p)}{spread(ps)} {unit} | {fmt(ratio)}× {better} |")


def trl_step(r):
    steps = [s["step_s"] for s in r["steps"]][1:] or [s["step_s"] for s in r["steps"]]
    return statistics.median(steps)


def trl_len(r):
    return statistics.median(r["mean_completion_len"])


print(f"rounds: {max((len(v) for v in runs.values()), default=0)}\n")
print("| measurement | Verity | peer | ratio (Verity / peer) |")
print("|---|---|---|---|")
for b in (1, 8):
    ours = med(f"verity-decode-b{b}", lambda r: r["tokens_per_s"])
    row(f"decode, batch {b}, 64 new tokens", ours, med("transformers", lambda r, b=b: r[f"gen_b{b}_tok_s"]["median"]),
        "transformers", "tok/s", True)
    # llamacpp_bench.py measures batch 1 only (a chat completion); llamacpp_batched.sh both
    for name in sorted(n for n in runs if n.startswith("llama-cpp-batched" if b == 8 else "llama-cpp-")):
        key = f"b{b}_tok_s"
        theirs = med(name, lambda r, key=key: r[key]["median"] if isinstance(r[key], dict) else r[key])
        row(f"decode, batch {b}", ours, theirs, name, "tok/s", True)
    row(f"decode, batch {b}, bf16 weight copies (`rollout_dtype`)", med(f"verity-decode-b{b}-bf16", lambda r: r["tokens_per_s"]),
        med("transformers", lambda r, b=b: r[f"gen_b{b}_tok_s"]["median"]), "transformers", "tok/s", True)
row("forward + backward, 8×128 tokens", med("verity-train-step", lambda r: r["forward_s"] + r["backward_s"]),
    med("transformers", lambda r: r["fwd_bwd_8x128_s"]["median"]), "torch", "s", False)
row("GRPO step, 1 × 8, ≤ 64 tokens", med("verity-grpo-step", lambda r: r["seconds_per_step"]),
    med("trl-grpo-step", trl_step), "TRL", "s", False)
row("GRPO step with bf16 rollouts", med("verity-grpo-step-bf16", lambda r: r["seconds_per_step"]),
    med("trl-grpo-step", trl_step), "TRL", "s", False)
ours_len = med("verity-grpo-step", lambda r: statistics.median(r["completion_length_mean"]))
trl_len_ = med("trl-grpo-step", trl_len)
row("mean completion length in that step", ours_len, trl_len_, "TRL", "tokens", True, words=None)
per_token = lambda step, length: (None, []) if step[0] is None or length[0] is None else (step[0] / length[0], [])
row("GRPO step per completion token", per_token(med("verity-grpo-step", lambda r: r["seconds_per_step"]), ours_len),
    per_token(med("trl-grpo-step", trl_step), trl_len_), "TRL", "s/token", False)
row("peak RSS of the GRPO step", med("verity-grpo-step", lambda r: r["peak_rss_mib"] / 1024),
    med("trl-grpo-step", lambda r: r["peak_rss_gib_ru_maxrss"]), "TRL", "GiB", False, words=("less", "more"))
row("peak RSS of forward + backward", med("verity-train-step", lambda r: r["peak_rss_fwd_bwd_mib"] / 1024),
    med("transformers", lambda r: r["peak_rss_gib"]), "transformers script (generate, fwd + bwd)", "GiB", False,
    words=("less", "more"))
