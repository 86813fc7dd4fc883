"""TRL's GRPOTrainer on the batch Verity trained on: the same prompts, completions (token ids),
rewards and hyperparameters, one optimisation step, compared with Verity's report.

    # 1. Verity draws a step's batch and trains on it (worker/examples/grpo_fixed_batch.rs):
    target/debug/examples/grpo_fixed_batch MODEL RECIPE TRAIN GRADER draw /tmp/batch.json
    target/debug/examples/grpo_fixed_batch MODEL RECIPE TRAIN GRADER train /tmp/batch.json \
        /tmp/verity.json model.norm.weight model.layers.0.input_layernorm.weight
    # 2. TRL on the same batch, from the same weights:
    python trl_fixed_batch.py --model MODEL --recipe RECIPE --train TRAIN \
        --batch /tmp/batch.json --verity /tmp/verity.json [--loss-type grpo|dapo|dr_grpo]

With `--steps K` on both sides (`grpo_fixed_batch … train BATCH OUT --steps K …`) each trainer
takes K steps on the batch, training on it again at each (advantages fixed, log-probs those of
the moment): past the first step, AdamW's update depends on its moments (the first step's is
about lr · sign(g) whatever they hold), so K > 1 checks the optimizer's state and schedule too.

It checks that the prompt token ids are what TRL's chat template gives, then compares, token by
token and weight by weight: advantages, per-token log-probs (and the sampler's), the loss, the
gradient norm before clipping, and the AdamW update. Prints a table and `SUMMARY {json}`;
`--check` exits 1 when a quantity differs beyond its tolerance. The loss type defaults to the
recipe's `loss` (Verity's default `grpo`); TRL's own default is `dapo`.
"""

import argparse
import json
import math
import sys
import tempfile

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--recipe", required=True, help="Verity's hyperparameters JSON")
ap.add_argument("--train", required=True, help="the training JSONL (to render the prompts with HF's template)")
ap.add_argument("--batch", required=True)
ap.add_argument("--verity", required=True, help="grpo_fixed_batch's train report")
ap.add_argument("--loss-type", default=None)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=1, help="optimisation steps on the batch (as Verity's report took)")
ap.add_argument("--advantages", choices=["verity", "trl"], default="verity",
                help="which advantages the loss uses (they differ in the std: see the table)")
ap.add_argument("--check", action="store_true")
args = ap.parse_args()
torch.set_num_threads(args.threads)

recipe = json.load(open(args.recipe))
batch = json.load(open(args.batch))
verity = json.load(open(args.verity))
loss_type = args.loss_type or recipe.get("loss", "grpo")
G = batch["group_size"]
N = len(batch["completions"])
T = recipe.get("temperature", 1.0)
LR = recipe.get("learning_rate", 1e-6)
MAX_TOKENS = recipe["max_completion_tokens"]
scale = recipe.get("scale_rewards", loss_type != "dr_grpo")
results = {"loss_type": loss_type, "completions": N, "group_size": G, "advantages_in_loss": args.advantages}

# ---- prompts: HF's chat template must give the ids Verity trained on -------------------------------------------
tok = AutoTokenizer.from_pretrained(args.model)
rendered = {}
for line in open(args.train):
    if line.strip():
        row = json.loads(line)
        text = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        rendered[text] = tok(text, add_special_tokens=False)["input_ids"]
prompt_ok = [rendered.get(t) == ids for t, ids in zip(batch["prompt_texts"], batch["prompts"])]
results["prompt_ids_match_hf_template"] = all(prompt_ok)
eos_ids = {tok.eos_token_id}
print(f"prompts rendered by HF's template match Verity's ids: {prompt_ok}; eos {tok.eos_token_id} "
      f"{tok.eos_token!r}; pad {tok.pad_token_id}")

# ---- the trainer, from the same weights ------------------------------------------------------------------------
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
config = GRPOConfig(
    output_dir=tempfile.mkdtemp(), num_generations=G, per_device_train_batch_size=N, gradient_accumulation_steps=1,
    max_completion_length=MAX_TOKENS, learning_rate=LR, beta=recipe.get("beta", 0.0), loss_type=loss_type,
    epsilon=recipe.get("epsilon_low", 0.2), epsilon_high=recipe.get("epsilon_high", recipe.get("epsilon_low", 0.2)),
    scale_rewards="group" if scale else "none", mask_truncated_completions=recipe.get("mask_truncated", False),
    temperature=T, use_cpu=True, bf16=False, report_to="none", lr_scheduler_type="constant", warmup_steps=0,
    weight_decay=recipe.get("weight_decay", 0.0), max_grad_norm=recipe.get("max_grad_norm", 1.0),
    gradient_checkpointing=False, save_strategy="no", disable_tqdm=True,
)
ds = Dataset.from_list([{"prompt": "x"}] * N)
trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
                      train_dataset=ds, processing_class=tok)
trainer.current_gradient_accumulation_steps = 1
model = trainer.model
model.train()

# ---- advantages, as _generate_and_score_completions computes them ---------------------------------------------
rewards = torch.tensor(batch["rewards"], dtype=torch.float32)
mean = rewards.view(-1, G).mean(dim=1).repeat_interleave(G)
std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
advantages = rewards - mean
if scale:
    advantages = advantages / (std + 1e-4)

# ---- inputs, padded as TRL pads them ---------------------------------------------------------------------------
pad = tok.pad_token_id
prompts = [p for p in batch["prompts"] for _ in range(G)]
P = max(map(len, prompts))
C = max(map(len, batch["completions"]))
prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
completion_ids = torch.tensor([c + [pad] * (C - len(c)) for c in batch["completions"]])
completion_mask = torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in batch["completions"]])
if config.mask_truncated_completions:
    truncated = torch.tensor([c[-1] not in (*trainer.eos_token_ids, pad) for c in batch["completions"]])
    completion_mask = completion_mask * (~truncated).unsqueeze(1).int()
# TRL's truncation test (the last token is not an EOS) against the sampler's finish reason
trl_truncated = [c[-1] not in trainer.eos_token_ids for c in batch["completions"]]
results["truncation_agrees"] = trl_truncated == batch["truncated"]
inputs = {
    "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
    "completion_mask": completion_mask,
    "advantages": torch.tensor(verity["advantages"], dtype=torch.float32) if args.advantages == "verity" else advantages,
    "num_items_in_batch": completion_mask.sum(), "old_per_token_logps": None,
}

# ---- per-token log-probs (TRL's scoring path: logits / T) -------------------------------------------------------
with torch.no_grad():
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), C)


def max_diff(rows_a, tensor_b):
    return max(abs(a - float(tensor_b[i, j])) for i, row in enumerate(rows_a) for j, a in enumerate(row))


results["logprob_max_diff_verity"] = max_diff(verity["logprobs"], logps)
results["logprob_max_diff_sampler"] = max_diff(batch["sampler_logprobs"], logps)
results["advantage_max_diff"] = max(abs(a - float(b)) for a, b in zip(verity["advantages"], advantages))
results["advantages_verity"] = [round(a, 4) for a in verity["advantages"][:G]]
results["advantages_trl"] = [round(float(a), 4) for a in advantages[:G]]

# ---- loss, gradient, AdamW steps -------------------------------------------------------------------------------
before = {n: p.detach().clone() for n, p in model.named_parameters()}
trainer.create_optimizer_and_scheduler(num_training_steps=recipe.get("max_steps", 40))
trl_steps = []
for _ in range(args.steps):
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
    lr = trainer.lr_scheduler.get_last_lr()[0]
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.optimizer.zero_grad()
    trl_steps.append({"loss": float(loss), "grad_norm": grad_norm, "lr": lr})
verity_steps = verity.get("step_metrics", [verity["metrics"]])
assert len(verity_steps) == args.steps, f"Verity's report has {len(verity_steps)} steps, --steps is {args.steps}"
results["loss"] = {"verity": verity_steps[0]["loss"], "trl": trl_steps[0]["loss"]}
results["grad_norm"] = {"verity": verity_steps[0]["grad_norm"], "trl": trl_steps[0]["grad_norm"]}
results["lr"] = {"verity": verity_steps[0]["learning_rate"], "trl": trl_steps[0]["lr"]}
results["steps"] = [{"loss": (v["loss"], t["loss"]), "grad_norm": (v["grad_norm"], t["grad_norm"]),
                     "lr": (v["learning_rate"], t["lr"])} for v, t in zip(verity_steps, trl_steps)]
deltas = {n: (p.detach() - before[n]) for n, p in model.named_parameters()}
trl_norms = {n: float(d.norm()) for n, d in deltas.items()}
results["update_norm"] = {"verity": verity["update_norm"], "trl": math.sqrt(sum(v * v for v in trl_norms.values()))}
common = sorted(set(trl_norms) & set(verity["update_norms"]))
worst = max(common, key=lambda n: abs(trl_norms[n] - verity["update_norms"][n]) / max(trl_norms[n], 1e-12))
results["weights_compared"] = len(common)
results["update_norm_worst_rel_diff"] = {
    "weight": worst, "verity": verity["update_norms"][worst], "trl": trl_norms[worst]}
cosines = {}
for name, values in verity["updates"].items():
    a = torch.tensor(values)
    b = deltas[name].flatten()
    cosines[name] = float(torch.dot(a, b) / (a.norm() * b.norm()).clamp(min=1e-30))
results["update_cosine"] = cosines


def rel(pair):
    return abs(pair["verity"] - pair["trl"]) / max(abs(pair["trl"]), 1e-12)


checks = {
    "prompt ids": results["prompt_ids_match_hf_template"],
    "truncation": results["truncation_agrees"],
    "advantages (1e-3)": results["advantage_max_diff"] < 1e-3,
    "log-probs (2e-3)": results["logprob_max_diff_verity"] < 2e-3,
    "loss (1e-3 rel)": rel(results["loss"]) < 1e-3 or abs(results["loss"]["trl"]) < 1e-6,
    "grad norm (1e-2 rel)": rel(results["grad_norm"]) < 1e-2,
    "grad norm, every step (1e-2 rel)": all(
        rel({"verity": v, "trl": t}) < 1e-2 for v, t in (s["grad_norm"] for s in results["steps"])),
    "update norm (1e-2 rel)": rel(results["update_norm"]) < 1e-2,
    "update cosines (> 0.99)": all(c > 0.99 for c in cosines.values()),
}
for k, v in results.items():
    print(f"{k:32} {v}")
for k, ok in checks.items():
    print(f"{'ok  ' if ok else 'DIFF'} {k}")
results["checks"] = checks
print("SUMMARY", json.dumps(results), flush=True)
if args.check and not all(checks.values()):
    sys.exit(1)
