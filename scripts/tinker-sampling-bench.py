#!/usr/bin/env python3
"""Sampling throughput through the Tinker API (`asample`, the official `tinker` SDK) against the
same generations through `/v1/completions`, on one Verity server: `clients` concurrent requests at
a time, `requests` rounds, `max_tokens` each, the same prompt and seeds on both paths.

    python scripts/tinker-sampling-bench.py --url http://127.0.0.1:8080 --key vt-… \
        --model smollm2-135m-instruct --tokenizer ~/.cache/verity/models/smollm2-135m-instruct \
        --clients 1,8 --requests 3 --max-tokens 32

Needs the `tinker` SDK (it brings httpx and transformers); prints one JSON line per path and
concurrency: completion tokens per second and the median request latency.
"""
import argparse
import asyncio
import json
import statistics
import time

import httpx
import tinker
from tinker import types
from transformers import AutoTokenizer

PROMPT = "Write a short story about a robot who learns to paint."


async def tinker_round(sampler, ids, clients, max_tokens, seed0):
    async def one(i):
        started = time.perf_counter()
        params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed0 + i)
        r = await sampler.sample_async(prompt=types.ModelInput.from_ints(ids), num_samples=1,
                                       sampling_params=params)
        return len(r.sequences[0].tokens), time.perf_counter() - started
    return await asyncio.gather(*(one(i) for i in range(clients)))


async def openai_round(http, args, clients, seed0):
    async def one(i):
        started = time.perf_counter()
        r = await http.post("/v1/completions", json={
            "model": args.model, "prompt": PROMPT, "max_tokens": args.max_tokens,
            "temperature": 1.0, "seed": seed0 + i})
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"], time.perf_counter() - started
    return await asyncio.gather(*(one(i) for i in range(clients)))


def report(path, clients, rounds, wall):
    results = [x for round_ in rounds for x in round_]
    tokens = sum(t for t, _ in results)
    print(json.dumps({"path": path, "clients": clients, "requests": len(results),
                      "completion_tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
                      "median_latency_s": round(statistics.median(l for _, l in results), 3)}))


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True, help="the model's HF folder (its tokenizer)")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--requests", type=int, default=3, help="rounds per concurrency")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    ids = AutoTokenizer.from_pretrained(args.tokenizer).encode(PROMPT)
    service = tinker.ServiceClient(base_url=args.url, api_key="tml-" + args.key)
    sampler = await service.create_sampling_client_async(base_model=args.model)
    headers = {"Authorization": "Bearer " + args.key}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600) as http:
        # warm-up: the model loads on the inference worker
        await tinker_round(sampler, ids, 1, 4, 0)
        for clients in [int(c) for c in args.clients.split(",")]:
            for path in ("openai", "tinker"):
                rounds, started = [], time.perf_counter()
                for r in range(args.requests):
                    if path == "tinker":
                        rounds.append(await tinker_round(sampler, ids, clients, args.max_tokens, 1000 * r))
                    else:
                        rounds.append(await openai_round(http, args, clients, 1000 * r))
                report(path, clients, rounds, time.perf_counter() - started)
    service.close("success")


asyncio.run(main())
