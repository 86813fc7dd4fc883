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
# Verity's rollout precisions: (name suffix, words); llama.cpp is set beside f32 and int8.
PRECISIONS = [("", "f32 weights"), ("-bf16", "bf16 weight copies"), ("-int8", "int8 weight copies")]
for b in (1, 8):
    transformers = med("transformers", lambda r, b=b: r[f"gen_b{b}_tok_s"]["median"])
    for suffix, words in PRECISIONS:
        ours = med(f"verity-decode-b{b}{suffix}", lambda r: r["tokens_per_s"])
        if ours[0] is not None:
            row(f"decode, batch {b}, 64 new tokens, {words}", ours, transformers, "transformers", "tok/s", True)
    # llamacpp_bench.py measures batch 1 only (a chat completion); llamacpp_batched.sh both
    for name in sorted(n for n in runs if n.startswith("llama-cpp-batched" if b == 8 else "llama-cpp-")):
        key = f"b{b}_tok_s"
        theirs = med(name, lambda r, key=key: r[key]["median"] if isinstance(r[key], dict) else r[key])
        for suffix, words in PRECISIONS[::2]:
            ours = med(f"verity-decode-b{b}{suffix}", lambda r: r["tokens_per_s"])
            if ours[0] is not None:
                row(f"decode, batch {b}, {words}", ours, theirs, name, "tok/s", True)
row("forward + backward, 8×128 tokens", med("verity-train-step", lambda r: r["forward_s"] + r["backward_s"]),
    med("transformers", lambda r: r["fwd_bwd_8x128_s"]["median"]), "torch", "s", False)
trl_len_ = med("trl-grpo-step", trl_len)
trl_per_token = (lambda t, l: (None, []) if t[0] is None or l[0] is None else (t[0] / l[0], []))(
    med("trl-grpo-step", trl_step), trl_len_)
for suffix, words in PRECISIONS:
    step = med(f"verity-grpo-step{suffix}", lambda r: r["seconds_per_step"])
    if step[0] is None:
        continue
    rollouts = words.replace("weights", "rollouts").replace(" weight copies", " rollouts")
    row(f"GRPO step, 1 × 8, ≤ 64 tokens, {rollouts}", step, med("trl-grpo-step", trl_step), "TRL", "s", False)
    length = med(f"verity-grpo-step{suffix}", lambda r: statistics.median(r["completion_length_mean"]))
    row("mean completion length in that step", length, trl_len_, "TRL", "tokens", True, words=None)
    ours_per_token = (None, []) if length[0] is None else (step[0] / length[0], [])
    row(f"GRPO step per completion token, {rollouts}", ours_per_token, trl_per_token, "TRL", "s/token", False)
row("peak RSS of the GRPO step", med("verity-grpo-step", lambda r: r["peak_rss_mib"] / 1024),
    med("trl-grpo-step", lambda r: r["peak_rss_gib_ru_maxrss"]), "TRL", "GiB", False, words=("less", "more"))
row("peak RSS of forward + backward", med("verity-train-step", lambda r: r["peak_rss_fwd_bwd_mib"] / 1024),
    med("transformers", lambda r: r["peak_rss_gib"]), "transformers script (generate, fwd + bwd)", "GiB", False,
    words=("less", "more"))
