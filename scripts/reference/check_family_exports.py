"""Loads the checkpoint folders Verity wrote for each family fixture in transformers and checks
that transformers computes the fixture's reference logits from them: Verity's `config.json`
and weight names are what transformers reads.

    VERITY_FAMILY_DUMP=/tmp/families cargo test -p verity-worker --test families round_trips
    /tmp/peer/bin/python scripts/reference/check_family_exports.py /tmp/families
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

FIXTURES = Path(__file__).resolve().parents[2] / "worker/tests/data/families"
torch.set_grad_enabled(False)
failed = False
for folder in sorted(Path(sys.argv[1]).iterdir()):
    ref = json.loads((FIXTURES / folder.name / "reference.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64,
                                                 attn_implementation="eager")
    got = model(torch.tensor([ref["sequences"][0]])).logits[0]
    want = torch.tensor(ref["logits"][0], dtype=torch.float64)
    diff = (got - want).abs().max().item()
    # The tolerance of worker/tests/families.rs: f32 rounding relative to the logits' size.
    ok = diff < 1e-4 + 1e-4 * want.abs().max().item()
    print(f"{folder.name}: {type(model).__name__} ({got.dtype}), logits within {diff:.2e}"
          f" of the reference: {'ok' if ok else 'FAILED'}")
    failed = failed or not ok
sys.exit(1 if failed else 0)
