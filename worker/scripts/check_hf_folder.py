"""Optional check that a folder written by `verity models convert` loads in HF transformers.

Usage (needs `pip install torch transformers`):
    python worker/scripts/check_hf_folder.py ~/.cache/verity/models/smollm2-135m-instruct

Loads the tokenizer and model with transformers, renders the chat template, greedy-decodes the
test question and prints the answer (SmolLM2-135M-Instruct answers "7 + 5 = 12").
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

folder = sys.argv[1]
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
msgs = [{"role": "user", "content": "What is 7 + 5? Answer with just the number."}]
prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
with torch.no_grad():
    out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
print("PROMPT:", repr(prompt))
print("GREEDY:", repr(answer))
assert "12" in answer, answer
