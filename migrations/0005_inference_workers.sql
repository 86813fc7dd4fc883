-- Inference workers (`verity inference`): where API servers forward chat/completions requests.
-- A worker upserts its row with a heartbeat; rows not seen recently are ignored (and removed by
-- the worker itself on a clean shutdown). `token` authenticates the API servers to the worker.
CREATE TABLE inference_workers (
    id            uuid PRIMARY KEY,
    address       text NOT NULL CHECK (address <> ''),
    token         text NOT NULL CHECK (length(token) >= 32),
    models        jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(models) = 'array'),
    active        integer NOT NULL DEFAULT 0 CHECK (active >= 0),
    started_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inference_workers_last_seen ON inference_workers (last_seen_at);

CREATE INDEX jobs_fine_tuned_model ON jobs (org_id, fine_tuned_model) WHERE fine_tuned_model IS NOT NULL;
