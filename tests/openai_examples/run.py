"""Runs OpenAI's documented examples (examples.py) through the official `openai` SDK against a
live Verity server, and checks each outcome and each response field by field against the
documented one. Driven by cli/tests/live_server.rs (test
`openai_documentation_examples_are_accepted_and_graded`), which sets OPENAI_BASE_URL and
OPENAI_API_KEY and runs this file under the newest and the oldest supported SDK:

    python run.py            # every example; queues the jobs to train, prints `JOBS name=id …`
    JOB="name=id …" python run.py finished   # after a worker ran them: their results

Each phase prints `SDK OK` at its end; any difference fails an assertion naming the example.
"""
import io
import json
import os
import sys

import openai
from openai import OpenAI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from examples import (CALLS, EXAMPLES, JOBS, JUDGE, ROWS,  # noqa: E402
                      RUN_RESPONSE, SECURITY_FORMAT, STRUCTURED, TRAIN, TOOL_CALL, refused)

client = OpenAI()
# Whether the test server has an embedding model (for `cosine`); set by the driving test.
EMBEDDING = os.environ.get("VERITY_EXAMPLES_EMBEDDING") == "1"

# --- Comparing a response with the documented one --------------------------------------------

# Fields a documented response shows that Verity does not return, and why (each is listed in
# docs/openai-migration.md).
ABSENT = {
    "usage_metrics": "not in the API reference's job schema; Verity meters no usage",
    "shared_with_openai": "not in the API reference's job schema; Verity shares nothing with OpenAI",
    "cached_tokens": "Verity's judges count prompt and completion tokens only",
}
# Fields the API reference's schemas allow to be null (the examples show `{}`, `[]` or an
# object for some of them).
NULLABLE = {"error", "fine_tuned_model", "finished_at", "trained_tokens", "validation_file",
            "integrations", "estimated_finish", "metadata", "token_usage", "sampled_model_name",
            "param", "code", "message", "data", "python_grader_server_error_type",
            "python_grader_runtime_error_details", "model_grader_server_error_details", "first_id",
            "last_id"}
# Objects keyed by names (a model, a grader): each value is compared with the documented one.
MAPS = {"model_grader_token_usage_per_model", "scores", "sub_rewards"}
# Objects whose keys are Verity's own (docs/openai-migration.md#checkpoints): their type only;
# and a job's grader, compared with the one sent.
OWN_KEYS = {"metrics", "grader"}
STATUSES = {"validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"}
ID_PREFIXES = {"fine_tuning.job": "ftjob-", "fine_tuning.job.event": "ftevent-",
               "fine_tuning.job.checkpoint": "ftckpt"}


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def conforms(actual, documented, where):
    """Asserts that `actual` (a response as sent) has every field of `documented`, each of the documented type; constants (`object`) equal, ids with
    their object's prefix, statuses among OpenAI's."""
    if isinstance(documented, dict):
        assert isinstance(actual, dict), (where, actual)
        for key, value in documented.items():
            at = "%s.%s" % (where, key)
            if key in ABSENT:
                continue
            assert key in actual, "%s: missing (documented %r); the response has %s" % (at, value, sorted(actual))
            if actual[key] is None and (value is None or key in NULLABLE):
                continue
            if key == "object":
                assert actual[key] == value, (at, actual[key], value)
            elif key == "status":
                assert actual[key] in STATUSES, (at, actual[key])
            elif key == "id" and documented.get("object") in ID_PREFIXES:
                assert actual[key].startswith(ID_PREFIXES[documented["object"]]), (at, actual[key])
            elif key in ("training_file", "validation_file"):
                assert actual[key].startswith("file-"), (at, actual[key])
            elif key == "result_files":
                assert all(f.startswith("file-") for f in actual[key]), (at, actual[key])
            elif key in ("fine_tuned_model", "fine_tuned_model_checkpoint"):
                assert actual[key].startswith("ft:"), (at, actual[key])
            elif key in MAPS and isinstance(value, dict) and value:
                assert isinstance(actual[key], dict), (at, actual[key])
                model = next(iter(value.values()))
                for name, entry in actual[key].items():
                    conforms(entry, model, "%s[%s]" % (at, name))
            elif key in OWN_KEYS:
                assert isinstance(actual[key], dict), (at, actual[key])
            else:
                conforms(actual[key], value, at)
    elif isinstance(documented, list):
        assert isinstance(actual, list), (where, actual)
        if documented and actual:
            for i, item in enumerate(actual):
                conforms(item, documented[min(i, len(documented) - 1)], "%s[%d]" % (where, i))
    elif documented == "auto":
        assert actual == "auto" or is_number(actual), (where, actual)
    elif isinstance(documented, bool):
        assert isinstance(actual, bool), (where, actual)
    elif is_number(documented):
        assert is_number(actual), (where, actual)
    elif isinstance(documented, str):
        assert isinstance(actual, str), (where, actual)


def call(resource, name, /, *args, **kwargs):
    """`resource.name(...)` through the SDK: its typed answer, and the JSON as sent, which the
    typed object must carry whole (its `model_dump` has every field sent)."""
    response = getattr(resource.with_raw_response, name)(*args, **kwargs)
    typed, sent = response.parse(), json.loads(response.text)
    dumped = typed.model_dump(exclude_unset=True, by_alias=True, warnings=False)
    assert set(dumped) == set(sent), (name, sorted(dumped), sorted(sent))
    return typed, sent


# --- Outcomes ---------------------------------------------------------------------------------

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


def check_refused(ex, send):
    """Calls `send`, which must be refused as `ex` expects: a 400 in OpenAI's error shape
    naming the field."""
    expect = ex["expect"]
    try:
        answer = send()
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        assert e.status_code == 400 and {"message", "type", "param", "code"} <= set(body), (ex["name"], e.body)
        assert e.type == "invalid_request_error" and e.param == expect["param"], (ex["name"], e.param, e.message)
        assert expect["code"] is None or e.code == expect["code"], (ex["name"], e.code)
        assert expect["message"] is None or expect["message"] in e.message, (ex["name"], e.message)
        return
    raise AssertionError("%s (%s) was accepted: %r" % (ex["name"], ex["source"], answer))


def check_grader_run(ex, result, sent):
    """A graders/run answer, read through the SDK's types and compared with the reference's."""
    grader, expect = ex["body"]["grader"], ex["expect"]
    meta = result.metadata
    name = ex["name"]
    assert meta.type == grader["type"] and meta.name == grader.get("name", ""), (name, result)
    dumped = meta.errors.model_dump()
    assert all(dumped[flag] in (True, False) for flag in FLAGS), (name, dumped)
    assert all(detail in dumped for detail in DETAILS), (name, dumped)
    assert meta.execution_time >= 0 and isinstance(result.sub_rewards, dict), (name, result)
    conforms(sent, RUN_RESPONSE, name)
    if expect.get("judge"):
        # a random-weight judge: any score, or a reply it could not read, never a failure to run
        assert 0 <= result.reward <= 1 and raised(result) in ([], ["model_grader_parse_error"]), (name, result)
        assert meta.sampled_model_name == JUDGE, (name, result)
        assert isinstance(meta.token_usage, int) and meta.token_usage > 0, (name, result)
        usage = result.model_grader_token_usage_per_model[JUDGE]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"] == meta.token_usage, usage
    else:
        tolerance = expect.get("tolerance", 1e-9)
        assert raised(result) == [] and abs(result.reward - expect["reward"]) < tolerance, (name, ex["source"], result)
        assert meta.sampled_model_name is None and meta.token_usage is None, (name, result)
    for key, score in expect.get("scores", {}).items():
        # (a judge's unreadable reply stops its multigrader before the scores)
        assert meta.scores.get(key) == score or raised(result), (name, meta.scores)


def upload(rows):
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    uploaded = client.files.create(file=("rows.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert uploaded.status == "processed", uploaded
    return uploaded.id


def with_files(value, files):
    """`value` with each `"@rows"` replaced by the id of that uploaded file."""
    if isinstance(value, dict):
        return {k: with_files(v, files) for k, v in value.items()}
    if isinstance(value, str) and value.startswith("@"):
        return files[value[1:]]
    return value


def job_ids():
    return [j.id for j in client.fine_tuning.jobs.list(limit=100).data]


HYPERPARAMETERS = {
    "supervised": ["batch_size", "learning_rate_multiplier", "n_epochs"],
    "dpo": ["batch_size", "learning_rate_multiplier", "n_epochs", "beta"],
    "reinforcement": ["batch_size", "learning_rate_multiplier", "n_epochs", "eval_interval",
                      "eval_samples", "compute_multiplier", "reasoning_effort"],
}


def create_job(body):
    """`jobs.create` with the example's body, its fields as keyword arguments; fields the SDK
    has no argument for go in `extra_body`, as a user's would."""
    known = {"model", "training_file", "hyperparameters", "integrations", "metadata", "method",
             "seed", "suffix", "validation_file"}
    kwargs = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    return call(client.fine_tuning.jobs, "create", **kwargs, extra_body=extra or None)


def check_job(ex, body, job, sent):
    """A created job, through the SDK's types: OpenAI's fields, the method and its
    hyperparameters echoed (the given values as given, every other one resolved)."""
    expect, name = ex["expect"], ex["name"]
    assert job.object == "fine_tuning.job" and job.id.startswith("ftjob-"), (name, job)
    assert job.status == "queued" and job.model == body["model"], (name, job)
    assert job.training_file == body["training_file"], (name, job)
    assert job.validation_file == body.get("validation_file"), (name, job)
    assert job.fine_tuned_model is None and job.finished_at is None and job.result_files == [], (name, job)
    assert job.error is None and job.trained_tokens is None, (name, job)
    assert job.metadata == body.get("metadata") and job.user_provided_suffix == body.get("suffix"), (name, job)
    if "seed" in expect:
        assert job.seed == expect["seed"], (name, job.seed)
    kind = expect["method"]
    assert job.method.type == kind, (name, job.method)
    hp = getattr(job.method, kind).hyperparameters
    for key in HYPERPARAMETERS[kind]:
        value = getattr(hp, key)
        assert value == "auto" or is_number(value) or key == "reasoning_effort", (name, key, value)
    for key, value in expect["echoed"].items():
        assert getattr(hp, key) == value, (name, key, getattr(hp, key), value)
    if kind == "supervised":
        top = job.hyperparameters
        assert (top.n_epochs, top.batch_size, top.learning_rate_multiplier) == \
            (hp.n_epochs, hp.batch_size, hp.learning_rate_multiplier), (name, top, hp)
    if kind == "reinforcement":
        settings = sent["method"]["reinforcement"]
        assert settings["response_format"] == expect.get("response_format"), (name, settings)
        assert job.method.reinforcement.grader.type == settings["grader"]["type"], (name, job.method)
        assert settings["grader"] == body["method"]["reinforcement"]["grader"], (name, settings["grader"])
    conforms(sent, ex["documented"], name)


# --- The jobs Verity trains, besides the examples' own ------------------------------------------

# The RFT guide's job, trained: structured outputs and a multigrader over sample.output_json, on
# SmolLM2 (a tokenizer that can write JSON). A pinned seed (Verity's job seed): the judge is a
# random-weight model whose replies are scores only by chance; with this seed every step has a
# reply it can read, so the job runs to the end (an unseeded job may see every judge reply of a
# step out of range, which fails a job).
FLAGSHIP_SEED = int(os.environ.get("VERITY_FLAGSHIP_SEED", "1"))
FLAGSHIP_GRADER = {"type": "multi", "graders": {
    "explanation": {"type": "score_model", "name": "explanation", "model": JUDGE,  # OpenAI: "gpt-4o-2024-08-06"
                    "input": [{"role": "user", "type": "message",  # the guide's rubric, shortened
                               "content": "Score the explanation from 0 to 1.\nReference: {{item.explanation}}\n"
                                          "Explanation: {{sample.output_json.explanation}}"}],
                    "range": [0, 1]},
    "compliant": {"type": "string_check", "name": "compliant", "operation": "eq",
                  "input": "{{sample.output_json.compliant}}", "reference": "{{item.compliant}}"}},
    "calculate_output": "0.5 * compliant + 0.5 * explanation"}


def trained_flagship():
    security = upload([{"messages": [{"role": "user", "content": "Is storing passwords in plain text compliant?"}],
                        "compliant": "no", "explanation": "Passwords must be hashed."}] * 2)
    flagship = client.fine_tuning.jobs.create(
        model=STRUCTURED, training_file=security, validation_file=security, seed=FLAGSHIP_SEED,
        method={"type": "reinforcement", "reinforcement": {
            "grader": FLAGSHIP_GRADER, "response_format": SECURITY_FORMAT,
            # the guide's `reasoning_effort`, and a single short step for the test
            "hyperparameters": {"reasoning_effort": "medium", "n_epochs": 1, "batch_size": 1,
                                "max_steps": 1, "group_size": 2, "max_completion_tokens": 48,
                                "eval_interval": 1, "eval_samples": 1}}})
    echoed = flagship.method.reinforcement.model_dump()["response_format"]
    assert echoed == SECURITY_FORMAT, flagship
    return flagship.id


def trained_tool_job():
    """The graders guide's tool-call multigrader, trained on rows that offer a tool."""
    tools = [{"type": "function", "function": {"name": "get_acceptors", "description": "Acceptor count",
              "parameters": {"type": "object", "properties": {"smiles": {"type": "string"}}}}}]
    molecules = upload([{"messages": [{"role": "user", "content": "How many acceptors has CCO?"}],
                         "tools": tools, "smiles": "CCO"}] * 2)
    job = client.fine_tuning.jobs.create(
        model=TRAIN, training_file=molecules,
        method={"type": "reinforcement", "reinforcement": {"grader": TOOL_CALL, "response_format": None,
                "hyperparameters": {"n_epochs": 1, "batch_size": 1, "max_steps": 1, "group_size": 2,
                                    "max_completion_tokens": 8, "eval_interval": 0}}})
    return job.id


# --- Phase 1: every example ---------------------------------------------------------------------

def run_graders():
    graders = client.fine_tuning.alpha.graders
    for ex in EXAMPLES:
        body = ex["body"]
        validate = lambda: call(graders, "validate", grader=body["grader"])  # noqa: E731
        if ex["expect"].get("needs") == "embedding" and not EMBEDDING:
            ex = dict(ex, expect=refused("grader.evaluation_metric", by="verity",
                                         why="this server has no embedding model"))
        if ex["expect"]["outcome"] == "refused":
            check_refused(ex, validate if ex["kind"] == "graders.validate" else lambda: call(graders, "run", **body))
            continue
        # validate answers the grader back (OpenAI's ValidateGraderResponse)
        valid, sent = validate()
        assert valid.grader.type == body["grader"]["type"] and sent["grader"] == body["grader"], (ex["name"], sent)
        if ex["kind"] == "graders.run":
            check_grader_run(ex, *call(graders, "run", **body))

    # graders/validate runs a python grader once, as OpenAI does: an import that fails is a 400.
    try:
        client.fine_tuning.alpha.graders.validate(grader={
            "type": "python", "source": "import some_missing_module\n\ndef grade(sample, item):\n    return 1.0\n"})
        raise AssertionError("a python grader importing a missing module was validated")
    except openai.BadRequestError as e:
        assert "some_missing_module" in str(e) and e.param == "grader.source", e

    # A model_sample that is not JSON: output_json is unset and the grader reading it scores 0.
    [name_email] = [ex for ex in EXAMPLES if ex["name"] == "multigrader over structured outputs"]
    broken = client.fine_tuning.alpha.graders.run(grader=name_email["body"]["grader"], model_sample="John Doe",
                                                  item=name_email["body"]["item"])
    assert broken.reward == 0 and raised(broken) == ["sample_parse_error"], broken


def run_jobs(files):
    """Creates every job example; returns the jobs to train (name, id) and one queued job kept
    for the control calls."""
    to_train, kept = [], None
    for ex in JOBS:
        body = with_files(ex["body"], files)
        if ex["expect"]["outcome"] == "refused":
            before = job_ids()
            check_refused(ex, lambda: create_job(body))
            assert job_ids() == before, "%s: a refused body enqueued nothing" % ex["name"]
            continue
        job, sent = create_job(body)
        check_job(ex, body, job, sent)
        if kept is None:
            kept = job.id
        else:
            client.fine_tuning.jobs.cancel(job.id)
        if ex["train"]:
            trained = json.loads(json.dumps(body))
            kind = trained.setdefault("method", {"type": "supervised"})["type"]
            settings = trained["method"].setdefault(kind, {})
            settings["hyperparameters"] = dict(settings.get("hyperparameters", {}), **ex["train"])
            to_train.append((ex["name"], create_job(trained)[0].id))
    return to_train, kept


def run_calls(job, files):
    """The API reference's list, pause, resume, cancel and events on queued jobs."""
    for ex in CALLS:
        kind, args = ex["kind"], dict(ex["body"])
        if args.get("job") == "@finished":
            continue
        if kind == "jobs.list":
            # two jobs carry the metadata the example filters on, a third does not
            tagged = [client.fine_tuning.jobs.create(model=TRAIN, training_file=files["chats"], metadata=args["metadata"])
                      for _ in range(2)]
            client.fine_tuning.jobs.create(model=TRAIN, training_file=files["chats"], metadata={"key": "other"})
            page, sent = call(client.fine_tuning.jobs, "list", **args)
            assert [j.id for j in page.data] == [j.id for j in reversed(tagged)], (ex["name"], page)
            assert all(j.metadata == args["metadata"] for j in page.data), page
            conforms(sent, ex["documented"], ex["name"])
            for j in client.fine_tuning.jobs.list(limit=100).data:
                if j.status == "queued" and j.metadata:
                    client.fine_tuning.jobs.cancel(j.id)
            continue
        args.pop("job")
        if kind == "jobs.list_events":
            page, sent = call(client.fine_tuning.jobs, "list_events", job, **args)
            assert len(page.data) == args["limit"] and page.has_more, (ex["name"], page)
            assert all(e.object == "fine_tuning.job.event" and e.level in ("info", "warn", "error")
                       for e in page.data), page
            conforms(sent, ex["documented"], ex["name"])
            continue
        answer, sent = call(client.fine_tuning.jobs, kind.split(".")[1], job)
        assert answer.id == job and answer.status == ex["expect"]["status"], (ex["name"], answer)
        conforms(sent, ex["documented"], ex["name"])


def create_phase():
    names = [ex["name"] for ex in EXAMPLES + JOBS + CALLS]
    assert len(set(names)) == len(names), "each example has its own name"
    files = {name: upload(rows) for name, rows in ROWS.items()}
    run_graders()
    to_train, kept = run_jobs(files)
    run_calls(kept, files)
    to_train += [("flagship", trained_flagship()), ("tool call", trained_tool_job())]
    print("JOBS " + " ".join("%s=%s" % (name.replace(" ", "_"), id) for name, id in to_train))
    print("SDK OK")


# --- Phase 2: after the worker ran the trained jobs ---------------------------------------------

def check_flagship(job_id):
    """Constrained decoding: the schema's JSON, compact, from the first token; a complete one is
    read by the graders (`sample.output_json`), a cut one scores 0."""
    page = client.get("/fine_tuning/jobs/%s/samples" % job_id, cast_to=object)
    samples = [s["sample"] for s in page["data"]]
    assert samples, page
    for sample in samples:
        assert sample["completion"].startswith('{"compliant": "'), sample
        if sample["finish_reason"] != "length":
            parsed = json.loads(sample["completion"])
            assert set(parsed) == {"compliant", "explanation"}, sample
            assert "cannot be read" not in (sample["reason"] or ""), sample
            # the string check read `output_json.compliant` ("no" is the reference)
            compliant = 1.0 if parsed["compliant"] == "no" else 0.0
            assert sample["per_grader"]["compliant"] == compliant, sample
        # the random-weight judge may answer a score outside the range: the judge's fault
        error = sample["grader_error"]
        assert error is None or "grader 'explanation': judge" in error, sample


def check_tool_job(job_id):
    """The tiny model calls no tool: the tool-call grader cannot read a call (a sample parse
    error scored 0, never masked as an infrastructure error)."""
    page = client.get("/fine_tuning/jobs/%s/samples" % job_id, cast_to=object)
    samples = [s["sample"] for s in page["data"]]
    assert samples, page
    for sample in samples:
        assert sample["grader_error"] is None, sample
        assert sample["score"] == 0 and "cannot be read" in sample["reason"], sample


def finished_phase():
    jobs = [pair.split("=", 1) for pair in os.environ["JOB"].split()]
    for name, job_id in jobs:
        job = client.fine_tuning.jobs.retrieve(job_id)
        assert job.status == "succeeded", (name, job)
        assert job.fine_tuned_model.startswith("ft:") and job.trained_tokens > 0, (name, job)
        if name == "flagship":
            check_flagship(job_id)
        elif name == "tool_call":
            check_tool_job(job_id)
        elif name == "Reinforcement":
            page = client.get("/fine_tuning/jobs/%s/samples" % job_id, cast_to=object)
            assert page["data"] and all(s["sample"]["grader_error"] is None for s in page["data"]), page
    finished = dict(jobs)["supervised_job"]
    for ex in CALLS:
        if ex["body"].get("job") != "@finished":
            continue
        kind, args = ex["kind"], {k: v for k, v in ex["body"].items() if k != "job"}
        if kind == "jobs.retrieve":
            answer, sent = call(client.fine_tuning.jobs, "retrieve", finished)
            assert answer.status == ex["expect"]["status"] and answer.result_files, (ex["name"], answer)
            assert answer.finished_at >= answer.created_at and answer.estimated_finish is None, answer
        elif kind == "jobs.checkpoints.list":
            answer, sent = call(client.fine_tuning.jobs.checkpoints, "list", finished)
            assert answer.data, (ex["name"], answer)
            for checkpoint in answer.data:
                assert checkpoint.object == "fine_tuning.job.checkpoint", checkpoint
                assert checkpoint.fine_tuning_job_id == finished, checkpoint
                assert checkpoint.fine_tuned_model_checkpoint.endswith(":ckpt-step-%d" % checkpoint.step_number), checkpoint
        else:
            answer, sent = call(client.fine_tuning.jobs, "list_events", finished, **args)
            assert len(answer.data) == args["limit"], (ex["name"], answer)
        conforms(sent, ex["documented"], ex["name"])
    print("SDK OK")


if __name__ == "__main__":
    finished_phase() if sys.argv[1:] == ["finished"] else create_phase()
