#!/usr/bin/env python3
"""Checks that an HF folder written by Verity (`verity models convert`, or a full-weights
checkpoint) loads and runs in Hugging Face transformers unchanged.

    python3 scripts/check-hf-load.py DIR [--expect 12]

Loads DIR with AutoTokenizer / AutoModelForCausalLM (no remote code, offline), applies the chat
template to "What is 7 + 5? Answer with just the number.", decodes greedily and prints one JSON
line: the architecture, parameter count, the answer, and whether it contains --expect.
Exits 1 when loading fails or the answer lacks the expected text. Needs torch + transformers
(see shared/bench/README.md for a venv).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--expect", default="12")
    parser.add_argument("--question", default="What is 7 + 5? Answer with just the number.")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32)
    model.eval()
    messages = [{"role": "user", "content": args.question}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    ok = args.expect in answer
    print(json.dumps({
        "folder": args.folder,
        "architecture": model.config.architectures,
        "parameters": sum(p.numel() for p in model.parameters()),
        "answer": answer,
        "expected": args.expect,
        "ok": ok,
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
    }))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
