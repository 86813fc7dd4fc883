"""Sampling side by side: the completions Verity drew for a step's prompts against what TRL's
GRPOTrainer generates for the same prompt ids from the same weights (its own generation config
and EOS handling, `_generate_single_turn`), and Verity's sampler log-probs against the model's
tempered distribution as transformers computes it.

    # a draw with many samples per prompt (group_size 64 in the recipe, 2 prompts):
    target/debug/examples/grpo_fixed_batch MODEL RECIPE64 TRAIN GRADER draw /tmp/draw64.json
    python trl_sampling.py --model MODEL --recipe RECIPE64 --batch /tmp/draw64.json --seed 0

Prints, per side: mean completion length, the fraction cut at the budget, the fraction ending
at an EOS token, the fraction with a `\\boxed{}` matching nothing in particular (format), the
first tokens' distribution; then the largest difference between Verity's sampler log-probs and
transformers' log-probs of the same tokens; per prompt and overall, the difference of mean
length and of the cut fraction over its standard error (z; |z| > 2 is beyond sampling noise);
`SUMMARY {json}`.
"""

import argparse
import collections
import json
import tempfile

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--recipe", required=True)
ap.add_argument("--batch", required=True)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
recipe = json.load(open(args.recipe))
batch = json.load(open(args.batch))
G = batch["group_size"]
MAX = recipe["max_completion_tokens"]
T = recipe.get("temperature", 1.0)

tok = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
config = GRPOConfig(output_dir=tempfile.mkdtemp(), num_generations=G, per_device_train_batch_size=G,
                    max_completion_length=MAX, temperature=T, top_p=recipe.get("top_p", 1.0),
                    top_k=recipe.get("top_k", 0), use_cpu=True, bf16=False, report_to="none",
                    gradient_checkpointing=False, disable_tqdm=True)
trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
                      train_dataset=Dataset.from_list([{"prompt": "x"}] * G), processing_class=tok)
print("TRL generation config:", {k: v for k, v in trainer.generation_config.to_diff_dict().items()})
print("TRL eos ids:", trainer.eos_token_ids, "pad:", tok.pad_token_id)

trl = []
for prompt in batch["prompts"]:
    with torch.no_grad():
        ids, _ = trainer._generate_single_turn([prompt] * G, None, {}, G)
    trl.extend(ids)
verity = batch["completions"]
eos = set(trainer.eos_token_ids)


def stats(completions):
    n = len(completions)
    texts = [tok.decode(c, skip_special_tokens=True) for c in completions]
    return {
        "completions": n,
        "mean_length": sum(map(len, completions)) / n,
        "truncated": sum(len(c) >= MAX and c[-1] not in eos for c in completions) / n,
        "ends_at_eos": sum(c[-1] in eos for c in completions) / n,
        "tokens_after_eos": sum(any(t in eos for t in c[:-1]) for c in completions),
        "has_boxed": sum("\\boxed{" in t for t in texts) / n,
        "first_tokens": collections.Counter(tok.decode(c[:1]) for c in completions).most_common(4),
    }


result = {"verity": stats(verity), "trl": stats(trl)}


def z_of_means(a, b):
    """(mean(a) − mean(b)) over its standard error: |z| > 2 is a difference beyond sampling noise."""
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / max(len(a) - 1, 1)
    vb = sum((x - mb) ** 2 for x in b) / max(len(b) - 1, 1)
    return (ma - mb) / max((va / len(a) + vb / len(b)) ** 0.5, 1e-12)


# Per prompt and overall: length and cut, Verity against TRL, with the z of each difference.
per_prompt = []
for p in range(len(batch["prompts"])):
    v, t = verity[p * G:(p + 1) * G], trl[p * G:(p + 1) * G]
    cut = lambda cs: [float(len(c) >= MAX and c[-1] not in eos) for c in cs]
    per_prompt.append({"prompt": p, "length": (sum(map(len, v)) / G, sum(map(len, t)) / G),
                       "length_z": round(z_of_means([len(c) for c in v], [len(c) for c in t]), 2),
                       "cut": (sum(cut(v)) / G, sum(cut(t)) / G), "cut_z": round(z_of_means(cut(v), cut(t)), 2)})
result["per_prompt"] = per_prompt
result["length_z"] = round(z_of_means([len(c) for c in verity], [len(c) for c in trl]), 2)
result["cut_z"] = round(z_of_means([float(len(c) >= MAX and c[-1] not in eos) for c in verity],
                                   [float(len(c) >= MAX and c[-1] not in eos) for c in trl]), 2)

# Verity's sampler log-probs against transformers' log-softmax(logits / T) of the same tokens
diffs = []
with torch.no_grad():
    for i, (c, lps) in enumerate(zip(verity, batch["sampler_logprobs"])):
        prompt = batch["prompts"][i // G]
        logits = model(torch.tensor([prompt + c])).logits[0, len(prompt) - 1:-1] / T
        ref = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(c).unsqueeze(1)).squeeze(1)
        diffs.append(float((ref - torch.tensor(lps)).abs().max()))
        if i >= 15:
            break
result["sampler_logprob_max_diff"] = max(diffs)
for side in ("verity", "trl"):
    print(side, json.dumps(result[side]))
print("sampler log-prob max |diff| vs transformers (16 completions):", result["sampler_logprob_max_diff"])
for row in per_prompt:
    print("prompt", json.dumps(row))
print("length z (Verity − TRL):", result["length_z"], " cut z:", result["cut_z"])
print("SUMMARY", json.dumps(result), flush=True)
