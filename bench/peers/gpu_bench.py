"""The peer of `scripts/gpu-check.sh`'s benchmarks: transformers / PyTorch on the same GPU, the same
model shapes (random weights from the same config.json) and the same work as Verity's
`verity bench rollout | train-step --random-weights`, so that the two can be quoted as ratios
measured in one run.

- rollout: `generate` of exactly --new-tokens tokens per row (EOS suppressed), sampling at
  temperature 1, KV cache on, the same chat prompts as Verity's bench ("What is A + B?");
  tokens/s = rows * new tokens / wall time.
- train-step: one forward + backward + AdamW step (fused) over batch x seq-len tokens, the loss
  over the last three quarters of each row (Verity's bench scores the same positions), f32
  master weights under bf16 autocast (Verity's mixed precision on a GPU); median of --steps
  after one warm-up.

Usage: python3 gpu_bench.py --model DIR (config.json + tokenizer files) rollout --batch 64
       python3 gpu_bench.py --model DIR train-step --batch 8 --seq-len 512
Prints one JSON line per run, with the same keys as Verity's (`tokens_per_s`, `seconds`,
`model_tflops`).
"""
import argparse, json, statistics, time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--device", default="cuda")
sub = ap.add_subparsers(dest="bench", required=True)
r = sub.add_parser("rollout")
r.add_argument("--batch", type=int, default=8)
r.add_argument("--new-tokens", type=int, default=128)
t = sub.add_parser("train-step")
t.add_argument("--batch", type=int, default=8)
t.add_argument("--seq-len", type=int, default=512)
t.add_argument("--steps", type=int, default=3)
args = ap.parse_args()
torch.manual_seed(0)
dev = torch.device(args.device)


def load(dtype):
    config = AutoConfig.from_pretrained(args.model)
    with dev:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model, sum(p.numel() for p in model.parameters())


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


out = {"bench": args.bench, "peer": f"transformers {__import__('transformers').__version__} / torch {torch.__version__}",
       "model": args.model, "device": args.device}
if args.bench == "rollout":
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model, n = load(torch.bfloat16)
    model.eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {3 + 7 * i} + {11 + 5 * i}?"}],
                                       tokenize=False, add_generation_prompt=True) for i in range(args.batch)]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(dev)

    def gen():
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            o = model.generate(**enc, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=True,
                               temperature=1.0, top_k=0, top_p=1.0, use_cache=True, pad_token_id=tok.pad_token_id)
        sync()
        return time.perf_counter() - t0, o.shape[1] - enc["input_ids"].shape[1]

    gen()  # warm-up
    runs = [gen() for _ in range(3)]
    secs = statistics.median(s for s, _ in runs)
    generated = args.batch * runs[0][1]
    out.update(batch=args.batch, new_tokens=args.new_tokens, compute_dtype="bf16", seconds=secs,
               tokens_per_s=generated / secs, model_tflops=2 * n * generated / secs / 1e12)
else:
    model, n = load(torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=dev.type == "cuda")
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq_len), device=dev)
    labels = ids.clone()
    labels[:, : args.seq_len // 4] = -100

    def step():
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0

    step()  # warm-up
    secs = statistics.median(step() for _ in range(args.steps))
    tokens = args.batch * args.seq_len
    out.update(batch=args.batch, seq_len=args.seq_len, compute_dtype="bf16", seconds_per_step=secs,
               model_tflops=6 * n * tokens / secs / 1e12)
if dev.type == "cuda":
    out["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
print(json.dumps(out))
