-- Sampling runs (Verity extensions): evaluation reports and rejection sampling share the job
-- queue with fine-tuning jobs (the same fenced leases, retries, cancel, events, metrics and
-- samples rows), told apart by `kind`. Only `fine_tuning` rows are fine-tuning jobs
-- (`/v1/fine_tuning/jobs` lists and finds no other kind); the others have their own id prefix.
ALTER TABLE jobs ADD COLUMN kind text NOT NULL DEFAULT 'fine_tuning'
    CHECK (kind IN ('fine_tuning', 'evaluation', 'rejection_sampling'));
ALTER TABLE jobs DROP CONSTRAINT jobs_id_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_id_kind CHECK (
    (kind = 'fine_tuning' AND id LIKE 'ftjob-%') OR
    (kind = 'evaluation' AND id LIKE 'evaljob-%') OR
    (kind = 'rejection_sampling' AND id LIKE 'rsjob-%'));
DROP INDEX jobs_org_idx;
CREATE INDEX jobs_org_idx ON jobs (org_id, kind, created_at DESC, id DESC);
