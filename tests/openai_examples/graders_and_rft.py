"""OpenAI's published grader and reinforcement fine-tuning examples, run through the official
`openai` SDK against a live Verity server (driven by cli/tests/live_server.rs, which sets
OPENAI_BASE_URL and OPENAI_API_KEY and then runs the jobs this script queues).

Each body follows the example at its `source` URL. Only what cannot exist on a Verity test
server is changed, and each change is marked: OpenAI's model names become the server's test
models (`tiny-judge`, a tiny random model, trains and judges; the flagship job with structured
outputs trains SmolLM2-135M-Instruct, whose tokenizer can write JSON), and the long prose prompts of the RFT guide's
judge are shortened. Every example must be accepted (200) and graded: for `graders/run`, the
response is read field for field as the SDK types it (`result.metadata.errors.<flag>`).
Prints `JOBS <id> …` (the RFT jobs to run) and `SDK OK`.
"""
import io
import json
import os

import openai
from openai import OpenAI

client = OpenAI()
# OpenAI's "o4-mini-…" / "gpt-4o-…" / "gpt-5-mini" become the server's tiny random model, which
# both trains and judges
TRAIN = JUDGE = "tiny-judge"
# The flagship job's structured outputs need a tokenizer that can write JSON (the driving test
# registers SmolLM2-135M-Instruct for it); OpenAI's guide trains "o4-mini-2025-04-16".
STRUCTURED = os.environ.get("VERITY_STRUCTURED_MODEL", TRAIN)
FLAGSHIP_SEED = int(os.environ.get("VERITY_FLAGSHIP_SEED", "1"))

GRADERS_GUIDE = "https://platform.openai.com/docs/guides/graders"
RFT_GUIDE = "https://platform.openai.com/docs/guides/reinforcement-fine-tuning"
RUN_REFERENCE = "https://platform.openai.com/docs/api-reference/graders/run"
JOBS_REFERENCE = "https://platform.openai.com/docs/api-reference/fine-tuning/create"

FLAGS = ["formula_parse_error", "sample_parse_error", "truncated_observation_error",
         "unresponsive_reward_error", "invalid_variable_error", "other_error",
         "python_grader_server_error", "python_grader_runtime_error",
         "model_grader_server_error", "model_grader_refusal_error", "model_grader_parse_error"]
DETAILS = ["python_grader_server_error_type", "python_grader_runtime_error_details",
           "model_grader_server_error_details"]


def raised(result):
    """The error flags set on a graders/run result, read as SDK users read them."""
    errors = result.metadata.errors
    return [flag for flag in FLAGS if getattr(errors, flag)]


# (name, source, grader, model_sample, item, expected reward or None for a judge's any score)
RUNS = [
    ("string_check", GRADERS_GUIDE,
     {"type": "string_check", "name": "Example string check grader",
      "input": "{{sample.output_text}}", "reference": "{{item.label}}", "operation": "eq"},
     "positive", {"label": "positive"}, 1.0),
    ("text_similarity", GRADERS_GUIDE,
     {"type": "text_similarity", "name": "Example text similarity grader",
      "input": "{{sample.output_text}}", "reference": "{{item.reference_answer}}",
      "evaluation_metric": "fuzzy_match"},
     "fuzzy wuzzy was a bear", {"reference_answer": "fuzzy wuzzy was a bear"}, 1.0),
    ("python", GRADERS_GUIDE,
     {"type": "python", "name": "Example python grader", "image_tag": "2025-05-08",
      "source": "def grade(sample, item) -> float:\n"
                "    output_text = sample[\"output_text\"]\n"
                "    reference_answer = item[\"reference_answer\"]\n"
                "    return 1.0 if output_text == reference_answer else 0.0\n"},
     "fuzzy wuzzy", {"reference_answer": "fuzzy wuzzy"}, 1.0),
    # the guide's python grader over rapidfuzz, a package of the grader image (docs/graders.md#packages)
    ("python rapidfuzz", GRADERS_GUIDE,
     {"type": "python",
      "source": "from rapidfuzz import fuzz, utils\n\n"
                "def grade(sample, item) -> float:\n"
                "    output_text = sample[\"output_text\"]\n"
                "    reference_answer = item[\"reference_answer\"]\n"
                "    return fuzz.WRatio(output_text, reference_answer, processor=utils.default_process) / 100.0\n"},
     "fuzzy wuzzy was a bear", {"reference_answer": "fuzzy wuzzy had no hair"}, 0.7555555555555555),
    ("score_model", RUN_REFERENCE,
     {"type": "score_model", "name": "Example score model grader",
      "input": [{"role": "user", "content": [{"type": "input_text", "text":
          "Score how close the reference answer is to the model answer on a 0-1 scale. Return only "
          "the score.\n\nReference answer: {{item.reference_answer}}\n\nModel answer: {{sample.output_text}}"}]}],
      "model": JUDGE,  # OpenAI: "gpt-5-mini"
      "sampling_params": {"temperature": 1, "top_p": 1, "seed": 42}},
     "fuzzy wuzzy was a bear", {"reference_answer": "fuzzy wuzzy was a bear"}, None),
    ("score_model 32768 tokens", GRADERS_GUIDE,
     {"type": "score_model", "name": "Example score model grader", "model": JUDGE,  # OpenAI: "o4-mini-2025-04-16"
      "input": [{"role": "system", "content": "Grade the answer from 0 to 1."},
                {"role": "user", "content": "Reference: {{item.reference_answer}}. Answer: {{sample.output_text}}"}],
      "range": [0, 1], "sampling_params": {"seed": 42, "temperature": 1, "max_completions_tokens": 32768,
                                           "top_p": 1, "reasoning_effort": "medium"}},
     "a bear", {"reference_answer": "a bear"}, None),
    ("label_model", GRADERS_GUIDE,
     {"name": "First label grader", "type": "label_model", "model": JUDGE,  # OpenAI: "gpt-4o-2024-08-06"
      "input": [{"type": "message", "role": "system", "content": {"type": "input_text", "text":
                 "Classify the sentiment of the following statement as one of positive, neutral, or negative"}},
                {"type": "message", "role": "user", "content": {"type": "input_text", "text": "Statement: {{item.response}}"}}],
      "passing_labels": ["positive"], "labels": ["positive", "neutral", "negative"]},
     "x", {"response": "I love it"}, None),
    ("multi over output_json", GRADERS_GUIDE,
     {"type": "multi", "graders": {
         "name": {"name": "name_grader", "type": "text_similarity", "input": "{{sample.output_json.name}}",
                  "reference": "{{item.name}}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.9},
         "email": {"name": "email_grader", "type": "string_check", "input": "{{sample.output_json.email}}",
                   "reference": "{{item.email}}", "operation": "eq"}},
      "calculate_output": "(name + email) / 2"},
     json.dumps({"name": "John Doe", "email": "john.doe@gmail.com"}),
     {"name": "John Doe", "email": "john.doe@gmail.com"}, 1.0),
]

for name, source, grader, sample, item, expected in RUNS:
    valid = client.fine_tuning.alpha.graders.validate(grader=grader)
    assert valid.grader is not None, (name, source, valid)
    result = client.fine_tuning.alpha.graders.run(grader=grader, model_sample=sample, item=item)
    meta = result.metadata
    assert meta.type == grader["type"] and meta.name == grader.get("name", ""), (name, result)
    dumped = meta.errors.model_dump()
    assert all(dumped[flag] in (True, False) for flag in FLAGS), (name, dumped)
    assert all(detail in dumped for detail in DETAILS), (name, dumped)
    assert meta.execution_time >= 0 and isinstance(result.sub_rewards, dict), (name, result)
    if expected is None:
        # a random-weight judge: any score, or a reply it could not read, never a failure to run
        assert 0 <= result.reward <= 1 and raised(result) in ([], ["model_grader_parse_error"]), (name, result)
        assert meta.sampled_model_name == JUDGE, (name, result)
    else:
        assert raised(result) == [] and result.reward == expected, (name, source, result)

# graders/validate runs a python grader once, as OpenAI does: an import that fails is a 400.
try:
    client.fine_tuning.alpha.graders.validate(grader={
        "type": "python", "source": "import some_missing_module\n\ndef grade(sample, item):\n    return 1.0\n"})
    raise AssertionError("a python grader importing a missing module was validated")
except openai.BadRequestError as e:
    assert "some_missing_module" in str(e) and e.param == "grader.source", e

# A model_sample that is not JSON: output_json is unset and the grader reading it scores 0.
multi = RUNS[-1][2]
broken = client.fine_tuning.alpha.graders.run(grader=multi, model_sample="John Doe", item=RUNS[-1][4])
assert broken.reward == 0 and raised(broken) == ["sample_parse_error"], broken

# The graders guide's multi grader over a tool call (sample.output_tools), on rows with tools.
TOOL_GRADER = {"type": "multi", "graders": {
    "function_name": {"name": "function_name", "type": "string_check", "input": "get_acceptors",
                      "reference": "{{sample.output_tools[0].function.name}}", "operation": "eq"},
    "arguments": {"name": "arguments", "type": "string_check", "input": "{\"smiles\": \"{{item.smiles}}\"}",
                  "reference": "{{sample.output_tools[0].function.arguments}}", "operation": "eq"}},
    "calculate_output": "0.5 * function_name + 0.5 * arguments"}
assert client.fine_tuning.alpha.graders.validate(grader=TOOL_GRADER).grader is not None

# The RFT guide's flagship job: structured outputs and a multi grader over sample.output_json.
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "security_assistant", "strict": True,
    "schema": {"type": "object", "properties": {"compliant": {"type": "string"},
                                                "explanation": {"type": "string"}},
               "required": ["compliant", "explanation"], "additionalProperties": False}}}
FLAGSHIP_GRADER = {"type": "multi", "graders": {
    "explanation": {"type": "score_model", "name": "explanation", "model": JUDGE,  # OpenAI: "gpt-4.1-2025-04-14"
                    "input": [{"role": "user", "type": "message",  # the guide's rubric, shortened
                               "content": "Score the explanation from 0 to 1.\nReference: {{item.explanation}}\n"
                                          "Explanation: {{sample.output_json.explanation}}"}],
                    "range": [0, 1]},
    "compliant": {"type": "string_check", "name": "compliant", "operation": "eq",
                  "input": "{{sample.output_json.compliant}}", "reference": "{{item.compliant}}"}},
    "calculate_output": "0.5 * compliant + 0.5 * explanation"}


def upload(rows):
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return client.files.create(file=("rows.jsonl", io.BytesIO(data)), purpose="fine-tune").id


security = upload([{"messages": [{"role": "user", "content": "Is storing passwords in plain text compliant?"}],
                    "compliant": "no", "explanation": "Passwords must be hashed."}] * 2)
# A pinned seed (Verity's job seed): the judge here is a random-weight model whose replies are
# scores only by chance; with this seed every step has a reply it can read, so the job runs to
# the end (an unseeded job may see every judge reply of a step out of range, which fails a job).
flagship = client.fine_tuning.jobs.create(
    model=STRUCTURED, training_file=security, validation_file=security, seed=FLAGSHIP_SEED,
    method={"type": "reinforcement", "reinforcement": {
        "grader": FLAGSHIP_GRADER, "response_format": RESPONSE_FORMAT,
        # the guide's `reasoning_effort`, and a single short step for the test
        "hyperparameters": {"reasoning_effort": "medium", "n_epochs": 1, "batch_size": 1,
                            "max_steps": 1, "group_size": 2, "max_completion_tokens": 48,
                            "eval_interval": 1, "eval_samples": 1}}})
echoed = flagship.method.reinforcement.model_dump()["response_format"]
assert echoed == RESPONSE_FORMAT, flagship

tools = [{"type": "function", "function": {"name": "get_acceptors", "description": "Acceptor count",
          "parameters": {"type": "object", "properties": {"smiles": {"type": "string"}}}}}]
molecules = upload([{"messages": [{"role": "user", "content": "How many acceptors has CCO?"}],
                     "tools": tools, "smiles": "CCO"}] * 2)
tool_job = client.fine_tuning.jobs.create(
    model=TRAIN, training_file=molecules,
    method={"type": "reinforcement", "reinforcement": {"grader": TOOL_GRADER, "response_format": None,
            "hyperparameters": {"n_epochs": 1, "batch_size": 1, "max_steps": 1, "group_size": 2,
                                "max_completion_tokens": 8, "eval_interval": 0}}})

# The API reference's "Default" example: no `method` (OpenAI's legacy shape, supervised).
chats = upload([{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}])
default = client.fine_tuning.jobs.create(training_file=chats, model=TRAIN)  # OpenAI: "gpt-4o-mini"
assert default.method.type == "supervised", default
hyperparameters = client.fine_tuning.jobs.create(training_file=chats, model=TRAIN,
                                                 hyperparameters={"n_epochs": 2})
assert hyperparameters.method.supervised.hyperparameters.n_epochs == 2, hyperparameters
for job in (default, hyperparameters):
    client.fine_tuning.jobs.cancel(job.id)

print("JOBS %s %s" % (flagship.id, tool_job.id))
print("SDK OK")
