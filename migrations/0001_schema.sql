-- Verity's schema: tenancy, files, models, the job queue and everything a job writes.
-- State transitions and the fencing of worker writes are enforced here, not only in Rust.

CREATE TABLE orgs (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id             uuid PRIMARY KEY,
    org_id         uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    email          text NOT NULL UNIQUE CHECK (position('@' in email) > 1),
    password_hash  text,
    role           text NOT NULL DEFAULT 'member' CHECK (role IN ('admin', 'member')),
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX users_org_idx ON users (org_id);

CREATE TABLE api_keys (
    id            uuid PRIMARY KEY,
    org_id        uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    user_id       uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name          text NOT NULL DEFAULT '',
    -- The first characters of the key, shown in listings and used to find the row.
    prefix        text NOT NULL UNIQUE,
    key_hash      text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);
CREATE INDEX api_keys_org_idx ON api_keys (org_id);

CREATE TABLE files (
    id              text PRIMARY KEY CHECK (id LIKE 'file-%'),
    org_id          uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    filename        text NOT NULL,
    purpose         text NOT NULL,
    bytes           bigint NOT NULL DEFAULT 0 CHECK (bytes >= 0),
    line_count      bigint CHECK (line_count >= 0),
    status          text NOT NULL DEFAULT 'uploaded' CHECK (status IN ('uploaded', 'processed', 'error')),
    status_details  jsonb,
    storage_key     text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX files_org_idx ON files (org_id, created_at DESC, id DESC);

CREATE TABLE models (
    id              text PRIMARY KEY,
    -- NULL: a base model visible to every org.
    org_id          uuid REFERENCES orgs(id) ON DELETE CASCADE,
    kind            text NOT NULL CHECK (kind IN ('base', 'fine_tuned')),
    storage_prefix  text NOT NULL,
    format          text NOT NULL DEFAULT 'hf' CHECK (format IN ('hf', 'gguf', 'peft')),
    config          jsonb NOT NULL DEFAULT '{}',
    job_id          text,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE workers (
    id            text PRIMARY KEY,
    hostname      text NOT NULL DEFAULT '',
    device        text NOT NULL CHECK (device IN ('cpu', 'cuda')),
    memory_mb     bigint NOT NULL CHECK (memory_mb >= 0),
    started_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs (
    id                  text PRIMARY KEY CHECK (id LIKE 'ftjob-%'),
    org_id              uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    created_by          uuid REFERENCES users(id) ON DELETE SET NULL,
    model               text NOT NULL,
    training_file       text,
    validation_file     text,
    suffix              text,
    seed                bigint NOT NULL DEFAULT 0,
    -- The full job description (method, grader, hyperparameters) as submitted.
    spec                jsonb NOT NULL DEFAULT '{}',
    metadata            jsonb,
    state               text NOT NULL DEFAULT 'queued' CHECK (state IN
                          ('validating_files', 'queued', 'running', 'paused', 'succeeded', 'failed', 'cancelled')),
    priority            smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    required_device     text NOT NULL DEFAULT 'any' CHECK (required_device IN ('any', 'cpu', 'cuda')),
    required_memory_mb  bigint NOT NULL DEFAULT 0 CHECK (required_memory_mb >= 0),
    -- The fencing token: incremented by every claim; each worker write names it.
    attempt             integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    -- Attempts that ended in an error or an expired lease; retries stop at max_attempts.
    failures            integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    max_attempts        integer NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 100),
    run_after           timestamptz NOT NULL DEFAULT now(),
    worker_id           text,
    lease_expires_at    timestamptz,
    heartbeat_at        timestamptz,
    -- A request to the running worker, seen on its next heartbeat.
    control             text NOT NULL DEFAULT 'none' CHECK (control IN ('none', 'cancel', 'pause')),
    progress            jsonb,
    error               jsonb,
    result              jsonb,
    fine_tuned_model    text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT running_has_lease CHECK (
        (state = 'running') = (worker_id IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT control_only_while_running CHECK (control = 'none' OR state = 'running'),
    CONSTRAINT finished_iff_terminal CHECK (
        (state IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT running_was_claimed CHECK (state <> 'running' OR attempt > 0)
);
CREATE INDEX jobs_claim_idx ON jobs (priority DESC, created_at, id) WHERE state = 'queued';
CREATE INDEX jobs_lease_idx ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_org_idx ON jobs (org_id, created_at DESC, id DESC);

CREATE TABLE job_events (
    id          bigserial PRIMARY KEY,
    job_id      text NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    -- The attempt that wrote the event; NULL for events written by the server or by SQL itself.
    attempt     integer,
    level       text NOT NULL DEFAULT 'info' CHECK (level IN ('debug', 'info', 'warn', 'error')),
    kind        text NOT NULL,
    message     text NOT NULL,
    data        jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_events_job_idx ON job_events (job_id, id);

CREATE TABLE job_metrics (
    job_id      text NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    step        integer NOT NULL CHECK (step >= 0),
    attempt     integer NOT NULL CHECK (attempt > 0),
    data        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, step)
);

CREATE TABLE checkpoints (
    id              text PRIMARY KEY CHECK (id LIKE 'ftckpt-%'),
    job_id          text NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    step            integer NOT NULL CHECK (step >= 0),
    attempt         integer NOT NULL CHECK (attempt > 0),
    storage_prefix  text NOT NULL,
    bytes           bigint NOT NULL DEFAULT 0 CHECK (bytes >= 0),
    metrics         jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, step)
);

-- One row per sampled completion; the full text lives in jobs/{id}/samples/step-{n}.jsonl.
CREATE TABLE samples (
    job_id         text NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    step           integer NOT NULL CHECK (step >= 0),
    idx            integer NOT NULL CHECK (idx >= 0),
    attempt        integer NOT NULL CHECK (attempt > 0),
    prompt_idx     integer NOT NULL DEFAULT 0,
    score          double precision,
    advantage      double precision,
    finish_reason  text,
    storage_key    text NOT NULL,
    line_no        integer NOT NULL CHECK (line_no >= 0),
    PRIMARY KEY (job_id, step, idx)
);
CREATE INDEX samples_score_idx ON samples (job_id, score);

-- Allowed state transitions; anything else raises.
CREATE FUNCTION jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    IF NEW.state = OLD.state THEN
        RETURN NEW;
    END IF;
    IF NOT (
        (OLD.state = 'validating_files' AND NEW.state IN ('queued', 'failed', 'cancelled')) OR
        (OLD.state = 'queued'           AND NEW.state IN ('running', 'paused', 'cancelled', 'failed')) OR
        (OLD.state = 'running'          AND NEW.state IN ('queued', 'paused', 'succeeded', 'failed', 'cancelled')) OR
        (OLD.state = 'paused'           AND NEW.state IN ('queued', 'cancelled'))
    ) THEN
        RAISE EXCEPTION 'invalid job state transition % -> % for job %', OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'VT002';
    END IF;
    IF NEW.state = 'running' AND NEW.attempt <> OLD.attempt + 1 THEN
        RAISE EXCEPTION 'a claim must increment the attempt of job %', OLD.id USING ERRCODE = 'VT002';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER jobs_transition BEFORE UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_check_transition();

-- Every state change writes an event, whoever made it.
CREATE FUNCTION jobs_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO job_events (job_id, attempt, level, kind, message, data)
        VALUES (NEW.id, NULL, 'info', 'created', 'job created in state ' || NEW.state,
                jsonb_build_object('state', NEW.state));
    ELSIF NEW.state <> OLD.state THEN
        INSERT INTO job_events (job_id, attempt, level, kind, message, data)
        VALUES (NEW.id, NEW.attempt,
                CASE WHEN NEW.state = 'failed' THEN 'error' ELSE 'info' END,
                'state', OLD.state || ' -> ' || NEW.state,
                jsonb_build_object('from', OLD.state, 'to', NEW.state, 'attempt', NEW.attempt,
                                   'worker_id', coalesce(NEW.worker_id, OLD.worker_id), 'error', NEW.error));
    END IF;
    IF NEW.state = 'queued' AND (TG_OP = 'INSERT' OR OLD.state <> 'queued') THEN
        PERFORM pg_notify('verity_jobs', NEW.id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_transition_event AFTER INSERT OR UPDATE OF state ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_record_transition();

-- Fencing: a row that names an attempt may only be written while that attempt holds the job.
-- Rows written by triggers (pg_trigger_depth() > 1) are the database's own and pass.
CREATE FUNCTION fence_worker_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.attempt IS NULL OR pg_trigger_depth() > 1 THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM jobs WHERE id = NEW.job_id AND attempt = NEW.attempt AND state = 'running' FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'attempt % no longer holds job %', NEW.attempt, NEW.job_id USING ERRCODE = 'VT001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER job_events_fence BEFORE INSERT OR UPDATE ON job_events
    FOR EACH ROW EXECUTE FUNCTION fence_worker_write();
CREATE TRIGGER job_metrics_fence BEFORE INSERT OR UPDATE ON job_metrics
    FOR EACH ROW EXECUTE FUNCTION fence_worker_write();
CREATE TRIGGER checkpoints_fence BEFORE INSERT OR UPDATE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION fence_worker_write();
CREATE TRIGGER samples_fence BEFORE INSERT OR UPDATE ON samples
    FOR EACH ROW EXECUTE FUNCTION fence_worker_write();
