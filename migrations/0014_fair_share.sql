-- Fair share between orgs (see verity_core::queue::claim): the claim query serves first the org
-- with the fewest running jobs, then the one served least recently, then priority and age within
-- that org. Each claim records when it happened; the indexes keep the per-org lookups to one
-- index probe each, however many jobs are queued.
ALTER TABLE jobs ADD COLUMN claimed_at timestamptz;
UPDATE jobs SET claimed_at = started_at WHERE started_at IS NOT NULL;
CREATE INDEX jobs_org_claimed_idx ON jobs (org_id, claimed_at);
CREATE INDEX jobs_org_queued_idx ON jobs (org_id, priority DESC, created_at, id) WHERE state = 'queued';
CREATE INDEX jobs_org_running_idx ON jobs (org_id) WHERE state = 'running';
