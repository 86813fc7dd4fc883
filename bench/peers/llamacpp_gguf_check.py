"""llama.cpp itself on Verity's GGUF exports: loads each `smollm2.*.gguf` that
`VERITY_GGUF_DUMP=DIR cargo test -p verity-worker --test gguf_export` left in DIR with
llama-cpp-python (built as README.md says), checks that it tokenizes the chat prompts as Verity
does, and compares its greedy answers (16 tokens, top_k=1) with Verity's f32 model's.

usage: llamacpp_gguf_check.py DIR   -> one JSON line per file, and SUMMARY {json}
"""

import json
import sys
from pathlib import Path

from llama_cpp import Llama

TOKENS = 16


def main():
    folder = Path(sys.argv[1])
    doc = json.loads((folder / "answers.json").read_text())
    eos = set(doc["eos_token_ids"])
    summary = {}
    for path in sorted(folder.glob("smollm2.*.gguf")):
        quant = path.name.split(".")[1]
        llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, verbose=False)
        same, first, same_prompt = 0, 0, 0
        for row in doc["prompts"]:
            text = llm.detokenize(row["prompt_ids"], special=True).decode()
            ids = llm.tokenize(text.encode(), add_bos=False, special=True)
            same_prompt += ids == row["prompt_ids"]
            got = []
            for token in llm.generate(row["prompt_ids"], top_k=1, temp=0.0, repeat_penalty=1.0):
                if token in eos:
                    break
                got.append(token)
                if len(got) == TOKENS:
                    break
            llm.reset()
            want = [t for t in row["f32_answer_ids"] if t not in eos][:TOKENS]
            same += got == want
            first += bool(got) and bool(want) and got[0] == want[0]
        line = {"quant": quant, "prompts": len(doc["prompts"]), "identical_answers": same,
                "identical_first_token": first, "prompt_tokenized_the_same": same_prompt,
                "chat_template": "tokenizer.chat_template" in llm.metadata}
        print(json.dumps(line))
        summary[quant] = line
    print("SUMMARY " + json.dumps(summary))


if __name__ == "__main__":
    main()
