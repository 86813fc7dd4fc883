"""Writes the demo's addition set deterministically: every sum a + b of two digits 1-9 (81
questions), 16 drawn first as the validation set, the other 65 for training."""
import json
import random

SYSTEM = "You solve short arithmetic problems. Reply with the final number in \\boxed{}."


def row(a, b):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}]
    return json.dumps({"messages": messages, "reference_answer": str(a + b)}) + "\n"


pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
random.Random(5).shuffle(pairs)
with open("validation.jsonl", "w") as f:
    f.writelines(row(*p) for p in pairs[:16])
with open("train.jsonl", "w") as f:
    f.writelines(row(*p) for p in pairs[16:])
