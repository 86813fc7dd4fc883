-- A job's budget (Verity extension): optional caps on the wall time its attempts spend and on
-- the completion tokens its policy generates, and what it has used so far. The worker pauses the
-- job at the first step boundary where a cap is reached; the caps may be changed at any time
-- before the job ends (they are not hyperparameters: they change when it stops, not what it
-- computes).
ALTER TABLE jobs
    ADD COLUMN max_wall_seconds bigint CHECK (max_wall_seconds > 0),
    ADD COLUMN max_tokens bigint CHECK (max_tokens > 0),
    ADD COLUMN used_wall_seconds double precision NOT NULL DEFAULT 0 CHECK (used_wall_seconds >= 0),
    ADD COLUMN used_tokens bigint NOT NULL DEFAULT 0 CHECK (used_tokens >= 0);
