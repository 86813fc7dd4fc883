-- Progress of each job's export to Weights & Biases (jobs created with `integrations`): the run's
-- entity and project once the exporter created it, the last metrics step and the number of
-- history lines sent (the next line's offset in W&B's file stream), whether the run was closed,
-- and failures in a row (the exporter waits longer after each) with the last one's reason.
CREATE TABLE wandb_exports (
    job_id         text PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    entity         text,
    project        text,
    exported_step  integer NOT NULL DEFAULT -1,
    history_lines  integer NOT NULL DEFAULT 0 CHECK (history_lines >= 0),
    finished       boolean NOT NULL DEFAULT false,
    failures       integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    last_error     text,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- The exporter looks only at jobs with integrations.
CREATE INDEX jobs_with_integrations_idx ON jobs (created_at) WHERE spec ? 'integrations';
