"""OpenAI's published fine-tuning and grader examples, as data.

Three lists: EXAMPLES (graders/run and graders/validate), JOBS (jobs.create) and CALLS (list,
retrieve, pause, resume, cancel, events, checkpoints). Each entry is one example of OpenAI's
documentation: `source` (the page it comes from: the graders, RFT, supervised and DPO guides,
the API reference, the cookbooks), `kind` (the call), `body` (what the example sends) and
`expect` (the outcome Verity must give); `documented` is the response the example shows, which
the answer is compared with field by field. `run.py` sends each through the official `openai`
SDK.

The bodies keep each example's structure and values: field names, types, grader types and
operations, metrics, formulas, hyperparameter values. Only what cannot exist on a Verity test
server is changed, each change marked `# changed:` or `# shortened:`:
- OpenAI's model names become the test server's models (JUDGE, TRAIN, STRUCTURED);
- long prose (judge rubrics, system prompts) is shortened or rephrased;
- a file id is `"@<rows>"`: run.py uploads ROWS[<rows>] and puts its id there.

`expect` is one of:
- `accepted(...)`: 200, and for `graders.run` the reward (`reward=x`, or `judge=True` for a
  random-weight judge, which may answer any score or an unreadable reply), for `jobs.create`
  the method type and the hyperparameters echoed; `needs="embedding"`: only on a server with an
  embedding model (without one, a 400 naming the metric);
- `refused(param, ...)`: 400 naming `param`, with `why` saying who refuses it: OpenAI itself
  (`by="openai"`) or only Verity (`by="verity"`, a documented difference in
  docs/openai-migration.md).
"""

JUDGE = "tiny-judge"  # the test server's tiny random model: it trains and judges
TRAIN = "tiny-judge"
STRUCTURED = "smollm2"  # a tokenizer that can write JSON, for structured outputs

GRADERS_GUIDE = "https://developers.openai.com/api/docs/guides/graders"
RFT_GUIDE = "https://developers.openai.com/api/docs/guides/reinforcement-fine-tuning"
SFT_GUIDE = "https://developers.openai.com/api/docs/guides/supervised-fine-tuning"
DPO_GUIDE = "https://developers.openai.com/api/docs/guides/direct-preference-optimization"
REFERENCE = "https://developers.openai.com/api/reference/resources/fine_tuning/subresources"
JOBS_CREATE = REFERENCE + "/jobs/methods/create"
JOBS_LIST = REFERENCE + "/jobs/methods/list"
JOBS_RETRIEVE = REFERENCE + "/jobs/methods/retrieve"
JOBS_CANCEL = REFERENCE + "/jobs/methods/cancel"
JOBS_PAUSE = REFERENCE + "/jobs/methods/pause"
JOBS_RESUME = REFERENCE + "/jobs/methods/resume"
JOBS_EVENTS = REFERENCE + "/jobs/methods/list_events"
JOBS_CHECKPOINTS = REFERENCE + "/jobs/subresources/checkpoints/methods/list"
GRADERS_RUN = REFERENCE + "/alpha/subresources/graders/methods/run"
GRADERS_VALIDATE = REFERENCE + "/alpha/subresources/graders/methods/validate"
GRADER_OBJECTS = "https://developers.openai.com/api/reference/resources/graders/subresources/grader_models"
COOKBOOK_RFT = "https://cookbook.openai.com/examples/reinforcement_fine_tuning"
COOKBOOK_HEALTHBENCH = (
    "https://cookbook.openai.com/examples/fine-tuned_qa/reinforcement_finetuning_healthbench")


def accepted(**expected):
    return dict(expected, outcome="accepted")


def refused(param, by, why, code=None, message=None):
    return {"outcome": "refused", "param": param, "by": by, "why": why, "code": code,
            "message": message}


def example(name, source, kind, body, expect, documented=None, train=None):
    """One example; `train` (jobs only) are hyperparameters added to a second job, which the
    worker then runs, so that the example is also graded, within the test's time."""
    return {"name": name, "source": source, "kind": kind, "body": body, "expect": expect,
            "documented": documented, "train": train}


# --- Rows: the datasets the examples upload ---------------------------------------------------

def _weather_call(city):
    """One line of the supervised guide's JSONL example: the model calls get_current_weather."""
    return {"messages": [{"role": "user", "content": "What is the weather in %s?" % city},
                         {"role": "assistant", "tool_calls": [{"id": "call_id", "type": "function", "function": {
                             "name": "get_current_weather",
                             "arguments": "{\"location\": \"%s, USA\", \"format\": \"celsius\"}" % city}}]}],
            "parallel_tool_calls": False,
            "tools": [{"type": "function", "function": {
                "name": "get_current_weather", "description": "Get the current weather",
                "parameters": {"type": "object", "properties": {
                    "location": {"type": "string", "description": "The city and country, eg. %s, USA" % city},
                    "format": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["location", "format"]}}}]}


ROWS = {
    # the supervised guide's ten lines (OpenAI asks for at least ten)
    "sft_guide": [_weather_call(city) for city in (
        "San Francisco", "Minneapolis", "San Diego", "Memphis", "Atlanta", "Sunnyvale", "Chicago",
        "Boston", "Honolulu", "San Antonio")],
    # the DPO guide's example line (its answers shortened), four times for a batch
    "dpo_guide": [{"input": {"messages": [{"role": "user", "content": "Hello, can you tell me how cold San Francisco is today?"}],
                             "tools": [], "parallel_tool_calls": True},
                   "preferred_output": [{"role": "assistant", "content": "Today in San Francisco it is mild: a high near 68°F (20°C) and a low around 57°F (14°C)."}],  # shortened
                   "non_preferred_output": [{"role": "assistant", "content": "It is not particularly cold in San Francisco today."}]}] * 4,
    # the RFT guide's training set (its three lines, as given)
    "rft_guide_train": [
        {"messages": [{"role": "user", "content": "Do you have a dedicated security team?"}], "compliant": "yes",
         "explanation": "A dedicated security team follows strict protocols for handling incidents."},
        {"messages": [{"role": "user", "content": "Have you undergone third-party security audits or penetration testing in the last 12 months?"}],
         "compliant": "needs review",
         "explanation": "The policy does not explicitly mention undergoing third-party security audits or penetration testing. It only mentions SOC 2 and GDPR compliance."},
        {"messages": [{"role": "user", "content": "Is your software SOC 2, ISO 27001, or similarly certified?"}], "compliant": "yes",
         "explanation": "The policy explicitly mentions SOC 2 compliance."}],
    # the RFT guide's test set
    "rft_guide_test": [
        {"messages": [{"role": "user", "content": "Will our data be encrypted at rest?"}], "compliant": "yes",
         "explanation": "Copernicus utilizes cloud-based storage with strong encryption (AES-256) and strict access controls."},
        {"messages": [{"role": "user", "content": "Will data transmitted to/from your services be encrypted in transit?"}],
         "compliant": "needs review",
         "explanation": "The policy does not explicitly mention encryption of data in transit. It focuses on encryption in cloud storage."},
        {"messages": [{"role": "user", "content": "Do you enforce multi-factor authentication (MFA) internally?"}], "compliant": "yes",
         "explanation": "The policy explicitly mentions role-based authentication with multi-factor security."}],
    # the API reference's examples name files without showing them: a chat, and a row with the
    # `label` its string_check grader reads
    "chats": [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}],
    "labels": [{"messages": [{"role": "user", "content": "Is the sky blue? Answer yes or no."}], "label": "yes"}],
    # the cookbooks' rows, as their notebooks build them (one illustrative line each: the
    # notebooks read Hugging Face datasets)
    "medical": [{"messages": [{"role": "user", "content": "A 45-year-old man has sudden pain and swelling of the big toe after a feast. What is the likely diagnosis?"}],
                 "reference_answer": "gout"}],
    "healthbench": [{"messages": [{"role": "user", "content": "how many rest days per week do i need starting out"}]}],
}


# --- Graders ---------------------------------------------------------------------------------

STRING_CHECK = {"type": "string_check", "name": "Example string check grader",
                "input": "{{sample.output_text}}", "reference": "{{item.label}}", "operation": "eq"}

# The graders guide's text_similarity grader with each metric the guide lists.
SIMILARITY_METRICS = ["fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3",
                      "rouge_4", "rouge_5", "rouge_l"]


def similarity(metric):
    return {"type": "text_similarity", "name": "Example text similarity grader",
            "input": "{{sample.output_text}}", "reference": "{{item.label}}",
            "pass_threshold": 0.5, "evaluation_metric": metric}


# The graders guide's multigrader over structured outputs.
NAME_EMAIL = {"type": "multi", "graders": {
    "name": {"name": "name_grader", "type": "text_similarity", "input": "{{sample.output_json.name}}",
             "reference": "{{item.name}}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.9},
    "email": {"name": "email_grader", "type": "string_check", "input": "{{sample.output_json.email}}",
              "reference": "{{item.email}}", "operation": "eq"}},
    "calculate_output": "(name + email) / 2"}

# The graders guide's multigrader over a tool call (sample.output_tools).
TOOL_CALL = {"type": "multi", "graders": {
    "function_name": {"name": "function_name", "type": "string_check", "input": "get_acceptors",
                      "reference": "{{sample.output_tools[0].function.name}}", "operation": "eq"},
    "arguments": {"name": "arguments", "type": "string_check", "input": "{\"smiles\": \"{{item.smiles}}\"}",
                  "reference": "{{sample.output_tools[0].function.arguments}}", "operation": "eq"}},
    "calculate_output": "0.5 * function_name + 0.5 * arguments"}

# The RFT guide's multigrader: a judge scores the explanation, a string check the verdict.
SECURITY = {"type": "multi", "graders": {
    "explanation": {"name": "Explanation text grader", "type": "score_model",
                    "input": [{"role": "user", "type": "message", "content":
                               # shortened: the guide's rubric quotes a whole security policy
                               "Score how well the model answer matches the policy and the reference, "
                               "from 0 to 1. Reply with the number only.\n"
                               "Reference Answer: {{item.explanation}}\n"
                               "Model Answer: {{sample.output_json.explanation}}\n"}],
                    "model": JUDGE},  # changed: OpenAI's "gpt-4o-2024-08-06"
    "compliant": {"name": "compliant", "type": "string_check", "reference": "{{item.compliant}}",
                  "operation": "eq", "input": "{{sample.output_json.compliant}}"}},
    "calculate_output": "0.5 * compliant + 0.5 * explanation"}

SECURITY_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "security_assistant", "strict": True,
    "schema": {"type": "object", "properties": {"compliant": {"type": "string"},
                                                "explanation": {"type": "string"}},
               "required": ["compliant", "explanation"], "additionalProperties": False}}}

# The RFT cookbook's python graders, as its notebook builds them (`inspect.getsource` of each
# function, renamed `grade`).
CLINICAL_PHRASE = ("def grade(sample: dict, item: dict) -> float:\n"
                   "    from rapidfuzz import fuzz, utils\n"
                   "    score = fuzz.token_set_ratio(sample[\"output_text\"], item[\"reference_answer\"], processor=utils.default_process)\n"
                   "    return score / 100.0\n")
CLINICAL_BINARY = ("def grade(sample: dict, item: dict) -> float:\n"
                   "    return 1.0 if sample[\"output_text\"] == item[\"reference_answer\"] else 0.0\n")
COOKBOOK_MULTI = {"type": "multi", "graders": {
    "clinical_phrase": {"name": "clinical_phrase_grader", "image_tag": "2025-05-08",
                        "type": "python", "source": CLINICAL_PHRASE},
    "clinical_phrase_binary": {"name": "clinical_phrase_binary_grader", "image_tag": "2025-05-08",
                               "type": "python", "source": CLINICAL_BINARY}},
    "calculate_output": "0.85 * clinical_phrase + 0.15 * clinical_phrase_binary"}

# The RFT cookbook's final model grader ("model_grader_2").
COOKBOOK_JUDGE = {"type": "score_model", "name": "gpt41_score_model_2",
                  "input": [{"role": "system", "content":
                             # shortened: the cookbook's rubric (clinical layers, worked examples)
                             "You are an expert medical grader. Compare the reference answer with the "
                             "model's answer and return a score from 0 to 1."},
                            {"role": "user", "content": "Reference Answer: {{item.reference_answer}}. Model's Answer: {{sample.output_text}}"}],
                  "pass_threshold": 0.75,
                  "model": JUDGE,  # changed: OpenAI's "gpt-4.1-2025-04-14"
                  "range": [0, 1], "sampling_params": {"seed": 42, "temperature": 0}}

# The HealthBench cookbook's grader: one user message holding the whole rubric and conversation.
HEALTHBENCH_JUDGE = {"name": "score_health", "type": "score_model",
                     "input": [{"role": "user", "type": "message", "content":
                                # shortened: the cookbook's rubric and few-shot examples
                                "You are a reinforcement fine-tuning grader. Score from 0.0 to 1.0 how well "
                                "the agent's reply asks for the missing context. Output only the score.\n\n"
                                "Conversation:\n{{item.messages}}\n\nAgent reply:\n{{sample.output_text}}\n"}],
                     "model": JUDGE,  # changed: OpenAI's "o4-mini-2025-04-16"
                     "sampling_params": {"reasoning_effort": "low"}}

PYTHON_REFERENCE_SOURCE = ('def grade(sample: dict, item: dict) -> float:\n'
                           '    """\n'
                           '    Returns 1.0 if `output_text` equals `label`, otherwise 0.0.\n'
                           '    """\n'
                           '    output = sample.get("output_text")\n'
                           '    label = item.get("label")\n'
                           '    return 1.0 if output == label else 0.0\n')

LABEL_MODEL = {"name": "First label grader", "type": "label_model",
               "model": JUDGE,  # changed: OpenAI's "gpt-4o-2024-08-06"
               "input": [{"type": "message", "role": "system", "content": {"type": "input_text", "text":
                          "Classify the sentiment of the following statement as one of positive, neutral, or negative"}},
                         {"type": "message", "role": "user", "content": {"type": "input_text", "text": "Statement: {{item.response}}"}}],
               "passing_labels": ["positive"], "labels": ["positive", "neutral", "negative"]}

# The API reference's run response (its values are OpenAI's; run.py compares the shape).
RUN_RESPONSE = {
    "reward": 1.0,
    "metadata": {
        "name": "Example score model grader", "type": "score_model",
        "errors": {"formula_parse_error": False, "sample_parse_error": False,
                   "truncated_observation_error": False, "unresponsive_reward_error": False,
                   "invalid_variable_error": False, "other_error": False,
                   "python_grader_server_error": False, "python_grader_server_error_type": None,
                   "python_grader_runtime_error": False, "python_grader_runtime_error_details": None,
                   "model_grader_server_error": False, "model_grader_refusal_error": False,
                   "model_grader_parse_error": False, "model_grader_server_error_details": None},
        "execution_time": 4.365238428115845, "scores": {},
        # the example shows an object here; the reference's schema (and the SDK) an integer
        "token_usage": 324,
        "sampled_model_name": "gpt-4o-2024-08-06"},
    "sub_rewards": {},
    "model_grader_token_usage_per_model": {"gpt-4o-2024-08-06": {
        "prompt_tokens": 190, "total_tokens": 324, "completion_tokens": 134, "cached_tokens": 0}}}

SCORE_ALIGNMENT = {"type": "score_model", "name": "Example score model grader",
                   "input": [{"role": "user", "content": [{"type": "input_text", "text":
                              "Score how close the reference answer is to the model answer on a 0-1 scale. Return only "
                              "the score.\n\nReference answer: {{item.reference_answer}}\n\nModel answer: {{sample.output_text}}"}]}],
                   "model": JUDGE,  # changed: OpenAI's "gpt-5-mini"
                   "sampling_params": {"temperature": 1, "top_p": 1, "seed": 42}}


def run(grader, model_sample, item=None):
    body = {"grader": grader, "model_sample": model_sample}
    if item is not None:
        body["item"] = item
    return body


EXAMPLES = [
    # --- graders/run and graders/validate: the API reference ---
    example("validate: string check", GRADERS_VALIDATE, "graders.validate", {"grader": STRING_CHECK},
            accepted(), documented={"grader": STRING_CHECK}),
    example("run: score text alignment", GRADERS_RUN, "graders.run",
            run(SCORE_ALIGNMENT, "fuzzy wuzzy was a bear", {"reference_answer": "fuzzy wuzzy was a bear"}),
            accepted(judge=True), documented=RUN_RESPONSE),
    example("run: score an image caption", GRADERS_RUN, "graders.run", run(
        {"type": "score_model", "name": "Image caption grader",
         "input": [{"role": "user", "content": [
             {"type": "input_text", "text": "Score how well the provided caption matches the image on a 0-1 scale. Only return the score.\n\nCaption: {{sample.output_text}}"},
             {"type": "input_image", "image_url": "https://example.com/dog-catching-ball.png", "file_id": None, "detail": "high"}]}],
         "model": JUDGE,  # changed: OpenAI's "gpt-5-mini"
         "sampling_params": {"temperature": 0.2}},
        "A dog leaps to grab a tennis ball mid-air",
        {"expected_caption": "A golden retriever jumps to catch a tennis ball"}),
        refused("grader.input.0.content", by="verity", message="image parts are not supported",
                why="Verity's judges read text; OpenAI's judge reads images")),
    example("run: score an audio response", GRADERS_RUN, "graders.run", run(
        {"type": "score_model", "name": "Audio clarity grader",
         "input": [{"role": "user", "content": [
             {"type": "input_text", "text": "Listen to the clip and return a confidence score from 0 to 1 that the speaker said: {{item.target_phrase}}"},
             {"type": "input_audio", "input_audio": {"data": "{{item.audio_clip_b64}}", "format": "mp3"}}]}],
         "model": JUDGE,  # changed: OpenAI's "gpt-audio"
         "sampling_params": {"temperature": 0.2, "top_p": 1, "seed": 123}},
        "Please deliver the package on Tuesday",
        {"target_phrase": "Please deliver the package on Tuesday", "audio_clip_b64": "<base64-encoded mp3>"}),
        refused("grader.input.0.content", by="verity", message="audio parts are not supported",
                why="Verity's judges read text; OpenAI's audio judge hears the clip")),

    # --- the grader objects of the API reference ---
    example("StringCheckGrader object", GRADER_OBJECTS, "graders.run", run(STRING_CHECK, "positive", {"label": "positive"}),
            accepted(reward=1.0)),
    example("TextSimilarityGrader object", GRADER_OBJECTS, "graders.run", run(
        {"type": "text_similarity", "name": "Example text similarity grader", "input": "{{sample.output_text}}",
         "reference": "{{item.label}}", "evaluation_metric": "fuzzy_match"}, "a bear", {"label": "a bear"}),
        accepted(reward=1.0)),
    example("PythonGrader object", GRADER_OBJECTS, "graders.run", run(
        {"type": "python", "name": "Example python grader", "image_tag": "2025-05-08",
         "source": PYTHON_REFERENCE_SOURCE}, "positive", {"label": "positive"}),
        accepted(reward=1.0)),
    example("ScoreModelGrader object", GRADER_OBJECTS, "graders.run", run(
        {"type": "score_model", "name": "Example score model grader",
         "input": [{"role": "user", "content": [
             {"type": "input_text", "text": "Score how close the reference answer is to the model answer. Score 1.0 if "
                                            "they are the same and 0.0 if they are different. Return just a floating "
                                            "point score\n\n Reference answer: {{item.label}}\n\n Model answer: {{sample.output_text}}"},
             {"type": "input_image", "image_url": "https://example.com/reference.png", "file_id": None, "detail": "auto"}]}],
         "model": JUDGE,  # changed: OpenAI's "gpt-5-mini"
         "sampling_params": {"temperature": 1, "top_p": 1, "seed": 42, "max_completions_tokens": 32768,
                             "reasoning_effort": "medium"}},
        "a", {"label": "a"}),
        refused("grader.input.0.content", by="verity", message="image parts are not supported",
                why="Verity's judges read text; OpenAI's judge reads the reference image")),
    example("LabelModelGrader object", GRADER_OBJECTS, "graders.run", run(LABEL_MODEL, "x", {"response": "I love it"}),
            accepted(judge=True)),
    example("MultiGrader object", GRADER_OBJECTS, "graders.validate", {"grader": {
        "type": "multi", "name": "example multi grader",
        "graders": [{"type": "text_similarity", "name": "example text similarity grader", "input": "The graded text",
                     "reference": "The reference text", "evaluation_metric": "fuzzy_match"},
                    {"type": "string_check", "name": "Example string check grader", "input": "{{sample.output_text}}",
                     "reference": "{{item.label}}", "operation": "eq"}],
        "calculate_output": "0.5 * text_similarity_score +  0.5 * string_check_score)"}},
        refused("grader.graders", by="openai",
                why="the example's formula does not parse (an unmatched ')') and names no grader of it; "
                    "its `graders` is a list where the guide and the schema take an object of named graders")),
    example("MultiGrader object, as the guide writes a multigrader", GRADER_OBJECTS, "graders.run", run(
        {"type": "multi", "name": "example multi grader",
         # changed: `graders` as an object named after the formula's variables, the formula's ')' removed
         "graders": {"text_similarity_score": {"type": "text_similarity", "name": "example text similarity grader",
                                               "input": "The graded text", "reference": "The reference text",
                                               "evaluation_metric": "fuzzy_match"},
                     "string_check_score": STRING_CHECK},
         "calculate_output": "0.5 * text_similarity_score +  0.5 * string_check_score"},
        "yes", {"label": "yes"}),
        # fuzzy_match of the two fixed texts: 2 · 11 common characters / 33 = 2/3
        accepted(reward=0.5 * 2 / 3 + 0.5)),

    # --- the graders guide ---
    example("string check: eq", GRADERS_GUIDE, "graders.run", run(dict(STRING_CHECK, operation="eq"), "Paris", {"label": "Paris"}),
            accepted(reward=1.0)),
    example("string check: ne", GRADERS_GUIDE, "graders.run", run(dict(STRING_CHECK, operation="ne"), "Paris", {"label": "paris"}),
            accepted(reward=1.0)),
    example("string check: like", GRADERS_GUIDE, "graders.run", run(dict(STRING_CHECK, operation="like"), "It is Paris.", {"label": "Paris"}),
            accepted(reward=1.0)),
    example("string check: ilike", GRADERS_GUIDE, "graders.run", run(dict(STRING_CHECK, operation="ilike"), "It is PARIS.", {"label": "paris"}),
            accepted(reward=1.0)),
    example("string check: neq (the guide's prose)", GRADERS_GUIDE, "graders.validate",
            {"grader": dict(STRING_CHECK, operation="neq")},
            refused("grader.operation", by="openai",
                    why="the guide's list says `neq`, but its schema and the API reference's enum are eq, ne, like, ilike")),
] + [
    # identical texts: every lexical metric gives 1 but METEOR, whose fragmentation penalty
    # for one chunk of 5 matches is 0.5 * (1/5)^3 = 0.004
    example("text similarity: " + metric, GRADERS_GUIDE, "graders.run",
            run(similarity(metric), "fuzzy wuzzy was a bear", {"label": "fuzzy wuzzy was a bear"}),
            accepted(reward=0.996 if metric == "meteor" else 1.0))
    for metric in SIMILARITY_METRICS
] + [
    # OpenAI's guide: cosine (over text-embedding-3-large) "only available for evals"; Verity
    # computes it with its embedding model (all-MiniLM-L6-v2), and refuses it, naming the
    # metric, on a server without one (run.py expects that when the test server has none)
    example("text similarity: cosine", GRADERS_GUIDE, "graders.run",
            run(similarity("cosine"), "fuzzy wuzzy was a bear", {"label": "fuzzy wuzzy was a bear"}),
            accepted(reward=1.0, tolerance=1e-5, needs="embedding")),
    example("score model grader", GRADERS_GUIDE, "graders.run", run(
        {"type": "score_model", "name": "my_score_model",
         "input": [{"role": "system", "content":
                    # shortened: the guide's instructions, rephrased
                    "You are an expert grader. Exact match: 1. Similar meaning: 0.5. Otherwise: 0."},
                   {"role": "user", "content": "Reference: {{ item.reference_answer }}. Model answer: {{ sample.output_text }}"}],
         "pass_threshold": 0.5,
         "model": JUDGE,  # changed: OpenAI's "o4-mini-2025-04-16"
         "range": [0, 1],
         "sampling_params": {"max_completions_tokens": 32768, "top_p": 1, "reasoning_effort": "medium"}},
        "0.9", {"reference_answer": 1.0}),
        accepted(judge=True)),
    # carried over from this suite's first version; the guide's current text shows the grader above
    example("score model grader, seeded", GRADERS_GUIDE, "graders.run", run(
        {"type": "score_model", "name": "Example score model grader",
         "model": JUDGE,  # changed: OpenAI's "o4-mini-2025-04-16"
         "input": [{"role": "system", "content": "Grade the answer from 0 to 1."},  # shortened
                   {"role": "user", "content": "Reference: {{item.reference_answer}}. Answer: {{sample.output_text}}"}],
         "range": [0, 1], "sampling_params": {"seed": 42, "temperature": 1, "max_completions_tokens": 32768,
                                              "top_p": 1, "reasoning_effort": "medium"}},
        "a bear", {"reference_answer": "a bear"}),
        accepted(judge=True)),
    example("python grader", GRADERS_GUIDE, "graders.run", run(
        {"type": "python", "source": "def grade(sample, item):\n    return 1.0", "image_tag": "2025-05-08"}, "anything"),
        accepted(reward=1.0)),
    # carried over from this suite's first version; the guide's current text shows the grader below
    example("python grader, named", GRADERS_GUIDE, "graders.run", run(
        {"type": "python", "name": "Example python grader", "image_tag": "2025-05-08",
         "source": "def grade(sample, item) -> float:\n"
                   "    output_text = sample[\"output_text\"]\n"
                   "    reference_answer = item[\"reference_answer\"]\n"
                   "    return 1.0 if output_text == reference_answer else 0.0\n"},
        "fuzzy wuzzy", {"reference_answer": "fuzzy wuzzy"}),
        accepted(reward=1.0)),
    # rapidfuzz is a package of OpenAI's grader image (docs/graders.md#packages)
    example("python grader with rapidfuzz", GRADERS_GUIDE, "graders.run", run(
        {"type": "python",
         "source": "from rapidfuzz import fuzz, utils\n\n"
                   "def grade(sample, item) -> float:\n"
                   "    output_text = sample[\"output_text\"]\n"
                   "    reference_answer = item[\"reference_answer\"]\n"
                   "    return fuzz.WRatio(output_text, reference_answer, processor=utils.default_process) / 100.0\n"},
        "fuzzy wuzzy was a bear", {"reference_answer": "fuzzy wuzzy had no hair"}),
        accepted(reward=0.7555555555555555)),
    example("multigrader over structured outputs", GRADERS_GUIDE, "graders.run",
            run(NAME_EMAIL, "{\"name\": \"John Doe\", \"email\": \"john.doe@gmail.com\"}",
                {"name": "John Doe", "email": "john.doe@gmail.com"}),
            accepted(reward=1.0, scores={"name": 1.0, "email": 1.0})),
    example("multigrader over a tool call", GRADERS_GUIDE, "graders.validate", {"grader": TOOL_CALL}, accepted()),

    # --- the RFT guide and the cookbooks' graders ---
    example("security multigrader", RFT_GUIDE, "graders.run", run(
        SECURITY, "{\"compliant\": \"yes\", \"explanation\": \"A dedicated security team follows strict protocols for handling incidents.\"}",
        ROWS["rft_guide_train"][0]),
        accepted(judge=True, scores={"compliant": 1.0})),
    example("clinical phrase multigrader", COOKBOOK_RFT, "graders.run",
            run(COOKBOOK_MULTI, "gout", {"reference_answer": "gout"}),
            accepted(reward=1.0, scores={"clinical_phrase": 1.0, "clinical_phrase_binary": 1.0})),
    example("model grader 2", COOKBOOK_RFT, "graders.validate", {"grader": COOKBOOK_JUDGE}, accepted()),
    example("model grader 2, run", COOKBOOK_RFT, "graders.run",
            run(COOKBOOK_JUDGE, "gouty arthritis", {"reference_answer": "gout"}), accepted(judge=True)),
    example("health follow-up grader", COOKBOOK_HEALTHBENCH, "graders.run",
            run(HEALTHBENCH_JUDGE, "How many days a week do you plan to train?", ROWS["healthbench"][0]),
            accepted(judge=True)),
]


# --- Jobs ------------------------------------------------------------------------------------

# The documented job objects (values OpenAI's; run.py compares their fields' presence and types).
DEFAULT_RESPONSE = {
    "object": "fine_tuning.job", "id": "ftjob-abc123", "model": "gpt-4o-mini-2024-07-18",
    "created_at": 1721764800, "fine_tuned_model": None, "organization_id": "org-123",
    "result_files": [], "status": "queued", "validation_file": None, "training_file": "file-abc123",
    "method": {"type": "supervised", "supervised": {"hyperparameters": {
        "batch_size": "auto", "learning_rate_multiplier": "auto", "n_epochs": "auto"}}},
    "metadata": None}
EPOCHS_RESPONSE = {
    "object": "fine_tuning.job", "id": "ftjob-abc123", "model": "gpt-4o-mini", "created_at": 1721764800,
    "fine_tuned_model": None, "organization_id": "org-123", "result_files": [], "status": "queued",
    "validation_file": None, "training_file": "file-abc123",
    "hyperparameters": {"batch_size": "auto", "learning_rate_multiplier": "auto", "n_epochs": 2},
    "method": {"type": "supervised", "supervised": {"hyperparameters": {
        "batch_size": "auto", "learning_rate_multiplier": "auto", "n_epochs": 2}}},
    "metadata": None, "error": {"code": None, "message": None, "param": None}, "finished_at": None,
    "seed": 683058546, "trained_tokens": None, "estimated_finish": None, "integrations": [],
    "user_provided_suffix": None, "usage_metrics": None, "shared_with_openai": False}
DPO_RESPONSE = {
    "object": "fine_tuning.job", "id": "ftjob-abc", "model": "gpt-4o-mini", "created_at": 1746130590,
    "fine_tuned_model": None, "organization_id": "org-abc", "result_files": [], "status": "queued",
    "validation_file": "file-123", "training_file": "file-abc",
    "method": {"type": "dpo", "dpo": {"hyperparameters": {
        "beta": 0.1, "batch_size": "auto", "learning_rate_multiplier": "auto", "n_epochs": "auto"}}},
    "metadata": None, "error": {"code": None, "message": None, "param": None}, "finished_at": None,
    "hyperparameters": None, "seed": 1036326793, "estimated_finish": None, "integrations": [],
    "user_provided_suffix": None, "usage_metrics": None, "shared_with_openai": False}
REINFORCEMENT_RESPONSE = {
    "object": "fine_tuning.job", "id": "ftjob-abc123", "model": "o4-mini", "created_at": 1721764800,
    "finished_at": None, "fine_tuned_model": None, "organization_id": "org-123", "result_files": [],
    "status": "validating_files", "validation_file": "file-123", "training_file": "file-abc",
    "trained_tokens": None, "error": {}, "user_provided_suffix": None, "seed": 950189191,
    "estimated_finish": None, "integrations": [],
    "method": {"type": "reinforcement", "reinforcement": {
        "hyperparameters": {"batch_size": "auto", "learning_rate_multiplier": "auto", "n_epochs": "auto",
                            "eval_interval": "auto", "eval_samples": "auto", "compute_multiplier": "auto",
                            "reasoning_effort": "medium"},
        "grader": STRING_CHECK, "response_format": None}},
    "metadata": None, "usage_metrics": None, "shared_with_openai": False}
VALIDATION_RESPONSE = dict(DEFAULT_RESPONSE, validation_file="file-abc123")
WANDB_RESPONSE = dict(VALIDATION_RESPONSE, integrations=[
    {"type": "wandb", "wandb": {"project": "my-wandb-project", "entity": None, "run_id": "ftjob-abc123"}}])
# The supervised guide's finished job.
SUCCEEDED_RESPONSE = {
    "object": "fine_tuning.job", "id": "ftjob-uL1VKpwx7maorHNbOiDwFIn6", "model": "gpt-4.1-nano-2025-04-14",
    "created_at": 1746484925, "finished_at": 1746485841,
    "fine_tuned_model": "ft:gpt-4.1-nano-2025-04-14:openai::BTz2REMH", "organization_id": "org-abc123",
    "result_files": ["file-9TLxKY2A8tC5YE1RULYxf6"], "status": "succeeded", "validation_file": None,
    "training_file": "file-RCnFCYRhFDcq1aHxiYkBHw",
    "hyperparameters": {"n_epochs": 10, "batch_size": 1, "learning_rate_multiplier": 1},
    "trained_tokens": 1700, "error": {}, "user_provided_suffix": None, "seed": 1935755117,
    "estimated_finish": None, "integrations": [], "metadata": None, "usage_metrics": None,
    "shared_with_openai": False,
    "method": {"type": "supervised", "supervised": {"hyperparameters": {
        "n_epochs": 10, "batch_size": 1, "learning_rate_multiplier": 1.0}}}}

# The test's limits for a job the worker runs: one short step.
SHORT = {"max_steps": 1, "batch_size": 1, "n_epochs": 1}
SHORT_RFT = dict(SHORT, group_size=2, max_completion_tokens=8, eval_interval=0)

JOBS = [
    example("Default", JOBS_CREATE, "jobs.create",
            {"training_file": "@chats", "model": TRAIN},  # changed: OpenAI's "gpt-4o-mini"
            accepted(method="supervised", echoed={}), documented=DEFAULT_RESPONSE),
    example("Epochs", JOBS_CREATE, "jobs.create",
            {"training_file": "@chats", "model": TRAIN,  # changed: OpenAI's "gpt-4o-mini"
             "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}},
            accepted(method="supervised", echoed={"n_epochs": 2}), documented=EPOCHS_RESPONSE),
    example("Epochs, as top-level hyperparameters", JOBS_CREATE, "jobs.create",
            {"training_file": "@chats", "model": TRAIN, "hyperparameters": {"n_epochs": 2}},
            accepted(method="supervised", echoed={"n_epochs": 2}), documented=EPOCHS_RESPONSE),
    example("DPO", JOBS_CREATE, "jobs.create",
            {"training_file": "@dpo_guide", "validation_file": "@dpo_guide",
             "model": TRAIN,  # changed: OpenAI's "gpt-4o-mini"
             "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1}}}},
            accepted(method="dpo", echoed={"beta": 0.1}), documented=DPO_RESPONSE),
    example("Reinforcement", JOBS_CREATE, "jobs.create",
            {"training_file": "@labels", "validation_file": "@labels",
             "model": TRAIN,  # changed: OpenAI's "o4-mini"
             "method": {"type": "reinforcement", "reinforcement": {
                 "grader": STRING_CHECK, "hyperparameters": {"reasoning_effort": "medium"}}}},
            accepted(method="reinforcement", echoed={"reasoning_effort": "medium"}),
            documented=REINFORCEMENT_RESPONSE, train=SHORT_RFT),
    example("Reinforcement, the python variant", JOBS_CREATE, "jobs.create",
            {"training_file": "@labels", "validation_file": "@labels",
             "model": TRAIN,  # changed: OpenAI's "o4-mini"
             "method": {"type": "reinforcement", "reinforcement": {
                 "grader": {"name": "Example string check grader", "type": "string_check",
                            "input": "{{item.label}}", "operation": "eq", "reference": "{{sample.output_text}}"},
                 "hyperparameters": {"reasoning_effort": "medium"}}},
             "seed": 42},
            accepted(method="reinforcement", echoed={"reasoning_effort": "medium"}, seed=42),
            documented=REINFORCEMENT_RESPONSE),
    example("Validation file", JOBS_CREATE, "jobs.create",
            {"training_file": "@chats", "validation_file": "@chats", "model": TRAIN},  # changed: OpenAI's "gpt-4o-mini"
            accepted(method="supervised", echoed={}), documented=VALIDATION_RESPONSE),
    example("W&B Integration", JOBS_CREATE, "jobs.create",
            {"training_file": "@chats", "validation_file": "@chats", "model": TRAIN,  # changed: OpenAI's "gpt-4o-mini"
             "integrations": [{"type": "wandb", "wandb": {"project": "my-wandb-project", "name": "ft-run-display-name",
                                                          "tags": ["first-experiment", "v2"]}}]},
            # the test's server exports to a loopback W&B (WANDB_BASE_URL); the Rust test checks the run
            accepted(method="supervised", echoed={}), documented=WANDB_RESPONSE),
    example("supervised job", SFT_GUIDE, "jobs.create",
            {"training_file": "@sft_guide", "model": TRAIN},  # changed: OpenAI's "gpt-4.1-nano-2025-04-14"
            accepted(method="supervised", echoed={}), documented=DEFAULT_RESPONSE, train=SHORT),
    example("DPO job", DPO_GUIDE, "jobs.create",
            {"training_file": "@dpo_guide", "model": TRAIN,  # changed: OpenAI's "gpt-4o-2024-08-06"
             "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1}}}},
            accepted(method="dpo", echoed={"beta": 0.1}), documented=DPO_RESPONSE, train=SHORT),
    example("DPO job, beta auto", DPO_GUIDE, "jobs.create",
            # the guide: `beta` may be "auto" (the default), a value the platform chooses
            {"training_file": "@dpo_guide", "model": TRAIN,
             "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": "auto"}}}},
            accepted(method="dpo", echoed={"beta": 0.1}), documented=DPO_RESPONSE),
    example("security review job", RFT_GUIDE, "jobs.create",
            {"training_file": "@rft_guide_train", "validation_file": "@rft_guide_test",
             "model": STRUCTURED,  # changed: OpenAI's "o4-mini-2025-04-16"
             "method": {"type": "reinforcement", "reinforcement": {
                 "grader": SECURITY, "response_format": SECURITY_FORMAT,
                 "hyperparameters": {"reasoning_effort": "medium"}}}},
            accepted(method="reinforcement", echoed={"reasoning_effort": "medium"}, response_format=SECURITY_FORMAT),
            documented=REINFORCEMENT_RESPONSE),
    example("medical job", COOKBOOK_RFT, "jobs.create",
            {"training_file": "@medical", "validation_file": "@medical",  # changed: the notebook's `test_file`
             "model": TRAIN,  # changed: OpenAI's "o4-mini-2025-04-16"
             "suffix": "medical_01_verifiable_problem_gpt41_grader",
             "method": {"type": "reinforcement", "reinforcement": {
                 "grader": COOKBOOK_JUDGE, "response_format": None,
                 "hyperparameters": {"compute_multiplier": 1.0,
                                     "eval_samples": 1,  # changed: the notebook's `etest_samples`
                                     "eval_interval": 5, "n_epochs": 5, "reasoning_effort": "medium"}}},
             "seed": 42},
            accepted(method="reinforcement", seed=42,
                     echoed={"compute_multiplier": 1.0, "eval_samples": 1, "eval_interval": 5, "n_epochs": 5,
                             "reasoning_effort": "medium"}),
            documented=REINFORCEMENT_RESPONSE),
    example("medical job, as the notebook sends it", COOKBOOK_RFT, "jobs.create",
            {"training_file": "@medical", "test_file": "@medical", "model": TRAIN,
             "suffix": "medical_01_verifiable_problem_gpt41_grader",
             "method": {"type": "reinforcement", "reinforcement": {
                 "grader": COOKBOOK_JUDGE, "response_format": None,
                 "hyperparameters": {"compute_multiplier": 1.0, "etest_samples": 1, "eval_interval": 5,
                                     "n_epochs": 5, "reasoning_effort": "medium"}}},
             "seed": 42},
            refused("test_file", by="verity",
                    message="Unrecognized request argument supplied: test_file",
                    why="the notebook sends `test_file` for `validation_file` (and misspells `eval_samples`); "
                        "Verity refuses an unknown field by name rather than dropping it, as OpenAI's API "
                        "does for unrecognized arguments")),
    example("medical job, the notebook's hyperparameters", COOKBOOK_RFT, "jobs.create",
            {"training_file": "@medical", "validation_file": "@medical", "model": TRAIN,
             "method": {"type": "reinforcement", "reinforcement": {
                 "grader": COOKBOOK_JUDGE, "response_format": None,
                 "hyperparameters": {"compute_multiplier": 1.0, "etest_samples": 1, "eval_interval": 5,
                                     "n_epochs": 5, "reasoning_effort": "medium"}}},
             "seed": 42},
            refused("method.reinforcement.hyperparameters.etest_samples", by="verity",
                    message="unknown field `etest_samples`",
                    why="the notebook misspells `eval_samples`; Verity refuses an unknown hyperparameter "
                        "rather than dropping it. Whether OpenAI ignores the misspelling is not documented")),
    example("health follow-up job", COOKBOOK_HEALTHBENCH, "jobs.create",
            {"training_file": "@healthbench", "validation_file": "@healthbench",
             "model": TRAIN,  # changed: OpenAI's "o4-mini-2025-04-16"
             "method": {"type": "reinforcement", "reinforcement": {
                 "grader": HEALTHBENCH_JUDGE,
                 "hyperparameters": {"reasoning_effort": "medium", "n_epochs": 5, "batch_size": 4}}},
             "seed": 42},
            accepted(method="reinforcement", seed=42,
                     echoed={"reasoning_effort": "medium", "n_epochs": 5, "batch_size": 4}),
            documented=REINFORCEMENT_RESPONSE),
]


# --- The other job endpoints: their documented responses ---------------------------------------

CHECKPOINT = {"object": "fine_tuning.job.checkpoint", "id": "ftckpt_zc4Q7MP6XxulcVzj4MZdwsAB",
              "created_at": 1721764867,
              "fine_tuned_model_checkpoint": "ft:gpt-4o-mini-2024-07-18:my-org:custom-suffix:96olL566:ckpt-step-2000",
              "metrics": {"full_valid_loss": 0.134, "full_valid_mean_token_accuracy": 0.874},
              "fine_tuning_job_id": "ftjob-abc123", "step_number": 2000}
EVENT = {"object": "fine_tuning.job.event", "id": "ft-event-ddTJfwuMVpfLXseO0Am0Gqjm",
         "created_at": 1721764800, "level": "info", "message": "Fine tuning job successfully completed",
         "data": None, "type": "message"}
STOPPED = {"object": "fine_tuning.job", "id": "ftjob-abc123", "model": "gpt-4o-mini-2024-07-18",
           "created_at": 1721764800, "fine_tuned_model": None, "organization_id": "org-123",
           "result_files": [], "status": "cancelled", "validation_file": "file-abc123",
           "training_file": "file-abc123"}

# Calls on a queued job (`@job`, one of the accepted examples above) and on a finished one
# (`@finished`, the supervised guide's job after the worker ran it).
CALLS = [
    example("list", JOBS_LIST, "jobs.list", {"limit": 2, "metadata": {"key": "value"}}, accepted(),
            documented={"object": "list", "data": [dict(DEFAULT_RESPONSE, metadata={"key": "value"})],
                        "has_more": True}),
    example("pause", JOBS_PAUSE, "jobs.pause", {"job": "@job"}, accepted(status="paused"),
            documented=dict(STOPPED, status="paused")),
    example("resume", JOBS_RESUME, "jobs.resume", {"job": "@job"}, accepted(status="queued"),
            documented=dict(STOPPED, status="queued")),
    example("cancel", JOBS_CANCEL, "jobs.cancel", {"job": "@job"}, accepted(status="cancelled"),
            documented=STOPPED),
    example("list events", JOBS_EVENTS, "jobs.list_events", {"job": "@job", "limit": 2}, accepted(),
            documented={"object": "list", "data": [EVENT, dict(EVENT, message="New fine-tuned model created")],
                        "has_more": True}),
    example("retrieve", JOBS_RETRIEVE, "jobs.retrieve", {"job": "@finished"}, accepted(status="succeeded"),
            documented={
                "object": "fine_tuning.job", "id": "ftjob-abc123", "model": "davinci-002", "created_at": 1692661014,
                "finished_at": 1692661190, "fine_tuned_model": "ft:davinci-002:my-org:custom_suffix:7q8mpxmy",
                "organization_id": "org-123", "result_files": ["file-abc123"], "status": "succeeded",
                "validation_file": None, "training_file": "file-abc123",
                "hyperparameters": {"n_epochs": 4, "batch_size": 1, "learning_rate_multiplier": 1.0},
                "trained_tokens": 5768, "integrations": [], "seed": 0, "estimated_finish": 0,
                "method": {"type": "supervised", "supervised": {"hyperparameters": {
                    "n_epochs": 4, "batch_size": 1, "learning_rate_multiplier": 1.0}}}}),
    example("a finished job", SFT_GUIDE, "jobs.retrieve", {"job": "@finished"}, accepted(status="succeeded"),
            documented=SUCCEEDED_RESPONSE),
    example("list checkpoints", JOBS_CHECKPOINTS, "jobs.checkpoints.list", {"job": "@finished"}, accepted(),
            documented={"object": "list", "data": [CHECKPOINT], "first_id": CHECKPOINT["id"],
                        "last_id": CHECKPOINT["id"], "has_more": False}),
    example("list events of a finished job", JOBS_EVENTS, "jobs.list_events", {"job": "@finished", "limit": 2},
            accepted(), documented={"object": "list", "data": [EVENT, EVENT], "has_more": True}),
]
