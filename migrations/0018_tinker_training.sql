-- Tinker training clients (docs/tinker.md): each is a queue row of kind `tinker` (`tinkjob-…`),
-- claimed by a training worker that keeps the model and optimizer resident and runs the
-- client's calls in their order; a saved sampler weight is a checkpoint of that row, so it is a
-- Verity model like any job's checkpoint.
ALTER TABLE jobs DROP CONSTRAINT jobs_kind_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_kind_check
    CHECK (kind IN ('fine_tuning', 'evaluation', 'rejection_sampling', 'difficulty_profile', 'tinker'));
ALTER TABLE jobs DROP CONSTRAINT jobs_id_kind;
ALTER TABLE jobs ADD CONSTRAINT jobs_id_kind CHECK (
    (kind = 'fine_tuning' AND id LIKE 'ftjob-%') OR
    (kind = 'evaluation' AND id LIKE 'evaljob-%') OR
    (kind = 'rejection_sampling' AND id LIKE 'rsjob-%') OR
    (kind = 'difficulty_profile' AND id LIKE 'dpjob-%') OR
    (kind = 'tinker' AND id LIKE 'tinkjob-%'));

-- A training client: `<session>:train:<n>`, its queue row, and the next call it runs.
CREATE TABLE tinker_models (
    id          text PRIMARY KEY,
    session_id  text NOT NULL REFERENCES tinker_sessions(id) ON DELETE CASCADE,
    org_id      uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    job_id      text NOT NULL UNIQUE REFERENCES jobs(id) ON DELETE CASCADE,
    base_model  text NOT NULL,
    lora_rank   integer CHECK (lora_rank IS NULL OR lora_rank > 0),
    next_seq    integer NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tinker_models_org_idx ON tinker_models (org_id, created_at DESC);

-- A client's calls, run in `seq_id` order; each answers through its future.
CREATE TABLE tinker_calls (
    model_id    text NOT NULL REFERENCES tinker_models(id) ON DELETE CASCADE,
    seq_id      integer NOT NULL,
    future_id   text NOT NULL REFERENCES tinker_futures(id) ON DELETE CASCADE,
    kind        text NOT NULL,
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model_id, seq_id)
);

-- Saved weights by their `tinker://` path, and the Verity model each one is.
CREATE TABLE tinker_checkpoints (
    path        text PRIMARY KEY,
    org_id      uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    model_id    text NOT NULL REFERENCES tinker_models(id) ON DELETE CASCADE,
    kind        text NOT NULL CHECK (kind IN ('training', 'sampler')),
    -- The checkpoint of the client's queue row that holds the weights, and its model name.
    step        integer NOT NULL,
    model       text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tinker_checkpoints_model_idx ON tinker_checkpoints (model_id, created_at DESC);

