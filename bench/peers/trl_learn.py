"""TRL's GRPOTrainer on one of Verity's task folders, scored by Verity's own evaluator, written as
a peer run of a `verity bench learn` sweep (issue #51 item 5).

    python bench/peers/trl_learn.py --verity target/debug/verity --model $M \
        --task examples/arithmetic --seed 23 --mode defaults --out sweep-arith
    verity bench learn --model $M --task examples/arithmetic ... --out sweep-arith --report-only

TRL trains on the task's `train.jsonl` with the task's recipe (`recipe.json`, or
`--hyperparameters`): the same prompts per step (`batch_size`), completions per prompt
(`group_size`), steps, learning rate, temperature, completion budget, gradient clip and seed.
The reward is Verity's: every completion is graded by `verity graders run` with the task's
`grader.json`, so both trainers optimise the same number. `--mode` picks the rest:

- `defaults`: TRL's own `GRPOTrainer` defaults for what the recipe does not fix — its default
  `loss_type` (`dapo` in TRL 1.16), `scale_rewards`, and its learning-rate schedule (linear
  decay to 0, no warm-up).
- `matched`: the recipe's loss (`loss`, Verity's default `grpo`), its advantage scaling, and
  Verity's schedule (`warmup_steps` of linear warm-up, then constant).

Every `eval_interval` steps (and at the end) the model is saved and scored with
`verity bench learn --eval-only` on the task's held-out rows with the recipe's evaluation
settings, exactly as Verity's own runs are; the base model's score is the first point. The run
is written to `OUT/peers/trl-<mode>__seed=<seed>.jsonl` in the run format of a sweep (an
evaluation line per point with the completion tokens TRL generated so far, then a summary),
where `verity bench learn --out OUT --report-only` (or the sweep's next run) adds it to the
table and plots as the row `peer=trl-<mode>`.

Set-up: the venv of bench/peers/README.md (torch 2.15, transformers 5.24, trl 1.16).
Tool environments (`environment.json`) are not supported: TRL's GRPOTrainer has no Hermes
calculator episode loop to match Verity's.
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

ap = argparse.ArgumentParser()
ap.add_argument("--verity", required=True, help="the verity binary")
ap.add_argument("--model", required=True, help="HF folder (the one Verity's runs start from)")
ap.add_argument("--task", required=True, help="a task folder of examples/")
ap.add_argument("--hyperparameters", help="the recipe (default: the task's recipe.json)")
ap.add_argument("--seed", type=int, required=True)
ap.add_argument("--mode", choices=["defaults", "matched"], default="defaults")
ap.add_argument("--out", required=True, help="the sweep's folder (--out of verity bench learn)")
ap.add_argument("--threads", type=int, default=os.cpu_count())
args = ap.parse_args()
torch.set_num_threads(args.threads)

task = os.path.abspath(args.task)
recipe_path = args.hyperparameters or os.path.join(task, "recipe.json")
recipe = json.load(open(recipe_path))
if os.path.exists(os.path.join(task, "environment.json")):
    raise SystemExit("trl_learn.py: tool environments are not supported (see the docstring)")
grader = os.path.join(task, "grader.json")
P, G = recipe.get("batch_size", 4), recipe.get("group_size", 8)
STEPS = recipe["max_steps"]
EVAL_EVERY = recipe.get("eval_interval", 0) or STEPS
started = time.perf_counter()

# ---- Verity's grader as TRL's reward, and the tokens TRL generated ------------------------------------------
generated = {"tokens": 0}


def text_of(completion):
    """The completion's text: TRL passes conversational completions as a list of messages."""
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion)
    return completion


def verity_reward(prompts, completions, completion_ids=None, row=None, **_):
    generated["tokens"] += sum(len(ids) for ids in completion_ids)
    lines = "".join(json.dumps({"item": json.loads(r), "sample": {"output_text": text_of(c)}}) + "\n"
                    for r, c in zip(row, completions))
    out = subprocess.run([args.verity, "graders", "run", "--grader", grader, "--input", "-"],
                         input=lines, capture_output=True, text=True, check=True)
    scores = [json.loads(line)["score"] for line in out.stdout.splitlines() if line.strip()]
    assert len(scores) == len(completions), out.stderr
    return scores


# ---- Verity's evaluator on a saved model -------------------------------------------------------------------------
def evaluate(model_dir, step):
    out = subprocess.run([args.verity, "bench", "learn", "--model", model_dir, "--task", task,
                          "--hyperparameters", seeded_recipe, "--eval-only"],
                         capture_output=True, text=True, check=True)
    line = next(l for l in map(json.loads, out.stdout.splitlines()) if l["kind"] == "eval")
    point = {"kind": "eval", "step": step, "pass_at_k": line["pass_at_k"], "mean_reward": line["mean_reward"],
             "grader_errors": line.get("grader_errors", 0), "generated_tokens": generated["tokens"],
             "elapsed_s": time.perf_counter() - started}
    print(json.dumps(point), flush=True)
    return point


work = tempfile.mkdtemp(prefix="trl-learn-")
seeded_recipe = os.path.join(work, "recipe.json")
json.dump(dict(recipe, seed=args.seed), open(seeded_recipe, "w"))
points = []


class EvaluateOnSave(TrainerCallback):
    """Scores each saved checkpoint with Verity's evaluator, then removes it."""

    def on_save(self, a, state, control, **kw):
        ckpt = os.path.join(a.output_dir, f"checkpoint-{state.global_step}")
        points.append(evaluate(ckpt, state.global_step))
        shutil.rmtree(ckpt, ignore_errors=True)


# TRL's per-step logs under the names of Verity's step lines, to compare runs step by step.
STEP_FIELDS = {"reward": "reward_mean", "completions/mean_length": "completion_length_mean",
               "completions/clipped_ratio": "truncated_fraction", "frac_reward_zero_std": "zero_advantage_group_fraction",
               "entropy": "entropy", "grad_norm": "grad_norm", "learning_rate": "learning_rate", "loss": "loss"}
steps = []


class RecordSteps(TrainerCallback):
    """Keeps each training step's logged figures (TRL logs every step: logging_steps=1)."""

    def on_log(self, a, state, control, logs=None, **kw):
        if logs and "reward" in logs:
            line = {"kind": "step", "step": state.global_step}
            line.update({ours: float(logs[theirs]) for theirs, ours in STEP_FIELDS.items() if theirs in logs})
            line.update(generated_tokens=generated["tokens"], elapsed_s=time.perf_counter() - started)
            steps.append(line)


# ---- the trainer -------------------------------------------------------------------------------------------------
tok = AutoTokenizer.from_pretrained(args.model)
rows = [json.loads(l) for l in open(os.path.join(task, "train.jsonl")) if l.strip()]
ds = Dataset.from_list([{"prompt": r["messages"], "row": json.dumps(r)} for r in rows])
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
config = dict(
    output_dir=work, num_generations=G, per_device_train_batch_size=P * G, gradient_accumulation_steps=1,
    max_completion_length=recipe.get("max_completion_tokens", 256), learning_rate=recipe.get("learning_rate", 1e-6),
    temperature=recipe.get("temperature", 1.0), top_p=recipe.get("top_p", 1.0), beta=recipe.get("beta", 0.0),
    max_grad_norm=recipe.get("max_grad_norm", 1.0), max_steps=STEPS, seed=args.seed, data_seed=args.seed,
    use_cpu=True, bf16=False, report_to="none", logging_steps=1, disable_tqdm=True,
    save_strategy="steps", save_steps=EVAL_EVERY, save_only_model=True, dataloader_num_workers=0,
)
if args.mode == "matched":
    loss = recipe.get("loss", "grpo")
    config.update(loss_type=loss, scale_rewards="group" if recipe.get("scale_rewards", loss != "dr_grpo") else "none",
                  epsilon=recipe.get("epsilon_low", 0.2),
                  epsilon_high=recipe.get("epsilon_high", recipe.get("epsilon_low", 0.2)),
                  lr_scheduler_type="constant_with_warmup", warmup_steps=recipe.get("warmup_steps", 0),
                  mask_truncated_completions=recipe.get("mask_truncated", False))
config = GRPOConfig(**config)
schedule = getattr(config.lr_scheduler_type, "value", str(config.lr_scheduler_type))
print(f"trl_learn: mode {args.mode}: loss_type={config.loss_type} scale_rewards={config.scale_rewards} "
      f"lr={config.learning_rate} schedule={schedule} warmup={config.warmup_steps} "
      f"epsilon=({config.epsilon}, {config.epsilon_high}) T={config.temperature} "
      f"P×G={P}×{G} steps={STEPS}", flush=True)
points.append(evaluate(args.model, 0))
trainer = GRPOTrainer(model=model, reward_funcs=verity_reward, args=config, train_dataset=ds,
                      processing_class=tok, callbacks=[EvaluateOnSave(), RecordSteps()])
trainer.train()

# ---- the run, in a sweep's run format ------------------------------------------------------------------------------
name = f"trl-{args.mode}__seed={args.seed}"
os.makedirs(os.path.join(args.out, "peers"), exist_ok=True)
path = os.path.join(args.out, "peers", f"{name}.jsonl")
summary = {"kind": "summary", "peer": "trl", "mode": args.mode, "loss_type": config.loss_type,
           "lr_scheduler_type": schedule, "steps": STEPS,
           "validation_pass_at_1_before": points[0]["pass_at_k"].get("pass@1"),
           "validation_pass_at_1_after": points[-1]["pass_at_k"].get("pass@1"),
           "generated_tokens": generated["tokens"], "wall_s": time.perf_counter() - started}
with open(path + ".partial", "w") as f:
    f.write(json.dumps({"kind": "run", "peer": "trl", "mode": args.mode, "seed": args.seed}) + "\n")
    for point in sorted(points + steps, key=lambda p: (p["step"], p["kind"] == "eval")):
        f.write(json.dumps(point) + "\n")
    f.write(json.dumps(summary) + "\n")
os.replace(path + ".partial", path)
shutil.rmtree(work, ignore_errors=True)
print(json.dumps(summary), flush=True)
print(f"trl_learn: wrote {path}; `verity bench learn ... --out {args.out} --report-only` adds it to the table")
