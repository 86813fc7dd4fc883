#!/usr/bin/env python3
"""Writes the 4-digit multiplication example set with tools: train.jsonl and validation.jsonl.

Deterministic (fixed seed), so the committed files are exactly what this script prints.
Each row asks for a product of two 4-digit numbers (hard for a small model without a tool) and
carries `reference_answer` for the math grader. Run from this folder:  python3 generate.py
"""
import json
import random

# The call is spelled out once: SmolLM2-135M almost never writes a Hermes call from the tool
# description alone (1 call in 480 episodes of a 30-step run without this line).
SYSTEM = ("You multiply numbers. Use the calculator tool to compute, then reply with the final "
          "number in \\boxed{}. To call it, write exactly: <tool_call>{\"name\": \"calculator\", "
          "\"arguments\": {\"expression\": \"12 * 34\"}}</tool_call>")


def rows(rng: random.Random, count: int, seen: set) -> list:
    out = []
    while len(out) < count:
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        out.append({"messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": f"What is {a} * {b}?"}],
                    "reference_answer": str(a * b)})
    return out


# The tool description Verity adds to the system message of an episode's prompt for templates
# that do not render `tools` (SmolLM2's; worker/src/episodes/format.rs `tools_system_text`), so
# the demonstrations see the prompt the RL job's episodes see.
CALCULATOR = {"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluates an arithmetic expression (+ - * /, parentheses, min, max, abs).",
    "parameters": {"type": "object", "properties": {"expression": {
        "type": "string", "description": "e.g. 1234 * 5678"}}, "required": ["expression"]}}}
TOOLS_TEXT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(CALCULATOR, sort_keys=True, separators=(",", ":")) + "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")


def demonstration(row: dict) -> dict:
    """A supervised row: the episode's system prompt, the question, the call in the Hermes
    format, the tool's result as a `tool` message (rendered as the episode engine feeds it)
    and the boxed answer."""
    system = {"role": "system", "content": SYSTEM + "\n\n" + TOOLS_TEXT}
    question = row["messages"][1]["content"]
    a, b = question.removeprefix("What is ").removesuffix("?").split(" * ")
    call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
    answer = row["reference_answer"]
    return {"messages": [system, row["messages"][1],
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": f"<tool_response>\n{answer}\n</tool_response>"},
        {"role": "assistant", "content": f"\\boxed{{{answer}}}"}]}


def main() -> None:
    rng = random.Random(25)
    seen: set = set()
    for name, count in [("train.jsonl", 64), ("validation.jsonl", 16)]:
        with open(name, "w") as f:
            for row in rows(rng, count, seen):
                f.write(json.dumps(row) + "\n")
    # a warm start: 32 demonstrations on other products, for a supervised job before RL
    with open("sft.jsonl", "w") as f:
        for row in rows(rng, 32, seen):
            f.write(json.dumps(demonstration(row)) + "\n")


if __name__ == "__main__":
    main()
