#!/usr/bin/env python3
"""The Tinker protocol's cost around a training call: `forward_backward` round trips through the
official `tinker` SDK (submit, then wait for the future) against the worker's own time on the
same calls, which Verity records per call (`ran_ms` in `GET /api/v1/training_runs/{id}/calls`:
the in-process `forward_backward`, nothing around it). The difference is the protocol: the
request, the call's row in Postgres, the worker noticing it, the future's result and the SDK's
polling for it.

    python scripts/tinker-training-bench.py --url http://127.0.0.1:8080 --key vt-… \
        --model smollm2-135m-instruct --shapes 1x16,8x64 --calls 10

Each shape is DATUMSxTOKENS (random token ids, `cross_entropy`, all weights 1). Needs the
`tinker` SDK and a server with a training worker (`verity up` has one). Prints one JSON line per
shape: the median SDK round trip, the median worker time and the median difference, in seconds.
"""
import argparse
import json
import random
import statistics
import time
import urllib.request

import tinker
from tinker import types


def calls_of(url, key, run_id, count):
    request = urllib.request.Request(f"{url}/api/v1/training_runs/{run_id}/calls?limit={count}",
                                     headers={"X-API-Key": key})
    return json.load(urllib.request.urlopen(request))["calls"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True, help="a Verity API key (sent as tml-KEY)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--shapes", default="1x16,8x64")
    ap.add_argument("--calls", type=int, default=10, help="timed calls per shape (after one warm-up)")
    ap.add_argument("--rank", type=int, default=8)
    args = ap.parse_args()
    key = args.key if args.key.startswith("tml-") else "tml-" + args.key
    service = tinker.ServiceClient(base_url=args.url, api_key=key)
    client = service.create_lora_training_client(base_model=args.model, rank=args.rank).result()
    # The client's run id, as the SDK's RestClient names it.
    run_id = client.save_weights_for_sampler("bench-start").result().path.split("/")[2]
    rng = random.Random(7)
    for shape in args.shapes.split(","):
        datums, tokens = (int(x) for x in shape.split("x"))
        data = []
        for _ in range(datums):
            ids = [rng.randrange(100, 20000) for _ in range(tokens + 1)]
            data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                    loss_fn_inputs={"target_tokens": ids[1:],
                                                    "weights": [1.0] * tokens}))
        client.forward_backward(data, "cross_entropy").result()  # warm-up
        round_trips = []
        for _ in range(args.calls):
            started = time.perf_counter()
            client.forward_backward(data, "cross_entropy").result()
            round_trips.append(time.perf_counter() - started)
        logged = [c for c in calls_of(args.url, key, run_id, args.calls)
                  if c["kind"] == "forward_backward"]
        ran = [c["ran_ms"] / 1000 for c in logged]
        took = [c["took_ms"] / 1000 for c in logged]
        print(json.dumps({
            "shape": shape, "calls": args.calls,
            "sdk_round_trip_s": round(statistics.median(round_trips), 4),
            "server_took_s": round(statistics.median(took), 4),
            "worker_ran_s": round(statistics.median(ran), 4),
            "overhead_s": round(statistics.median(round_trips) - statistics.median(ran), 4),
        }), flush=True)
    service.close("success").result()


if __name__ == "__main__":
    main()
