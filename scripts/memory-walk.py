#!/usr/bin/env python3
"""The dashboard walk of issue #44 item 4, replayed against `verity up` through its API, with the
server's resident memory sampled throughout: one small reinforcement job on SmolLM2-135M, the
playground comparing the base and the fine-tuned model (chat completions to each), and an
evaluation report of the job. Prints the peak and final RSS of the `verity` process (Postgres
runs in processes of its own and is not counted) for each phase.

    scripts/memory-walk.py --verity target/debug/verity --data-dir /tmp/walk

The data folder must hold the demo model: the first run fetches and registers it through
`verity up --demo` (whose own peak is reported too). Standard library only.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"


def rss_mib(pid):
    """Resident memory of `pid` in MiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Sampler(threading.Thread):
    """Samples a process's RSS every 0.2 s and keeps the peak of the current phase."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.phase_peak, self.running = pid, 0.0, 0.0, True

    def run(self):
        while self.running:
            now = rss_mib(self.pid)
            self.peak, self.phase_peak = max(self.peak, now), max(self.phase_peak, now)
            time.sleep(0.2)

    def phase(self, name):
        """Reports the phase that just ended and starts the next."""
        print(f"walk: {name}: peak {self.phase_peak:.0f} MiB, now {rss_mib(self.pid):.0f} MiB", flush=True)
        self.phase_peak = rss_mib(self.pid)


class Api:
    def __init__(self, base, key):
        self.base, self.key = base, key

    def call(self, method, path, body=None, raw=None, content_type="application/json"):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.key}")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=600) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as error:
            sys.exit(f"walk: {method} {path}: HTTP {error.code}: {error.read()[:500]!r}")

    def upload(self, path):
        boundary = "walkboundary"
        content = Path(path).read_bytes()
        body = (
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{Path(path).name}\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode() + content + f"\r\n--{boundary}--\r\n".encode()
        return self.call("POST", "/v1/files", raw=body, content_type=f"multipart/form-data; boundary={boundary}")["id"]

    def wait(self, path, terminal=("succeeded", "failed", "cancelled")):
        while True:
            state = self.call("GET", path)
            if state["status"] in terminal:
                return state
            time.sleep(2)


def start(verity, data_dir, port, *extra):
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
    process = subprocess.Popen(
        [verity, "up", "--data-dir", str(data_dir), "--port", str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return process


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verity", default=str(ROOT / "target/debug/verity"))
    parser.add_argument("--data-dir", default="/tmp/verity-walk")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    data = Path(args.data_dir)

    if not (data / "admin-key").exists() or "--demo" in sys.argv:
        print("walk: registering the demo model with `verity up --demo` (its run is measured too)", flush=True)
        demo = start(args.verity, data, args.port, "--demo")
        sampler = Sampler(demo.pid)
        sampler.start()
        for line in demo.stdout:
            if "pass@1" in line or "Error" in line:
                print("  " + line.rstrip(), flush=True)
        demo.wait()
        sampler.running = False
        print(f"walk: verity up --demo: peak {sampler.peak:.0f} MiB (exit {demo.returncode})", flush=True)

    server = start(args.verity, data, args.port)
    for line in server.stdout:
        if line.startswith("Verity is up"):
            break
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
    key = (data / "admin-key").read_text().strip()
    api = Api(f"http://127.0.0.1:{args.port}", key)
    sampler = Sampler(server.pid)
    sampler.start()
    time.sleep(2)
    sampler.phase("idle after start")
    try:
        train = api.upload(ROOT / "examples/addition/train.jsonl")
        valid = api.upload(ROOT / "examples/addition/validation.jsonl")
        grader = json.loads((ROOT / "examples/addition/grader.json").read_text())
        hp = {"max_steps": args.steps, "batch_size": 2, "group_size": 4, "max_completion_tokens": 48,
              "learning_rate": 2e-5, "eval_samples": 16}
        job = api.call("POST", "/v1/fine_tuning/jobs", {
            "model": MODEL, "training_file": train, "validation_file": valid,
            "method": {"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}}})
        job = api.wait(f"/v1/fine_tuning/jobs/{job['id']}")
        sampler.phase(f"job of {args.steps} steps ({job['status']})")
        tuned = job.get("fine_tuned_model")
        for model in [MODEL, tuned] * 3:
            api.call("POST", "/v1/chat/completions", {
                "model": model, "max_tokens": 48, "seed": 1,
                "messages": [{"role": "user", "content": "What is 3 + 4?"}]})
        sampler.phase("playground: base and fine-tuned, 3 answers each")
        report = api.call("POST", "/v1/verity/evaluations", {"job": job["id"], "n": 4})
        report = api.wait(f"/v1/verity/evaluations/{report['id']}")
        sampler.phase(f"evaluation of the job ({report['status']})")
        time.sleep(5)
        sampler.phase("idle after the walk")
    finally:
        sampler.running = False
        server.terminate()
        server.wait(timeout=60)
    print(f"walk: peak over the walk {sampler.peak:.0f} MiB")


if __name__ == "__main__":
    main()
