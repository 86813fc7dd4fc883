-- Pulls from a hub through the API and the dashboard (docs/models.md, "Pulling from the API"):
-- a queue row of kind `model_pull` (`pulljob-…`) that a worker runs (fetch into its hub cache,
-- check, publish to the store, register for the org), with the queue's leases, retries, cancel
-- and events. Hub ids become unique per scope (one org's models, or the shared ones) instead of
-- across the whole registry, so that an org may pull a model another org holds privately; an
-- org's own model of a hub id comes before a shared one.
ALTER TABLE jobs DROP CONSTRAINT jobs_kind_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_kind_check
    CHECK (kind IN ('fine_tuning', 'evaluation', 'rejection_sampling', 'difficulty_profile',
                    'tinker', 'model_pull'));
ALTER TABLE jobs DROP CONSTRAINT jobs_id_kind;
ALTER TABLE jobs ADD CONSTRAINT jobs_id_kind CHECK (
    (kind = 'fine_tuning' AND id LIKE 'ftjob-%') OR
    (kind = 'evaluation' AND id LIKE 'evaljob-%') OR
    (kind = 'rejection_sampling' AND id LIKE 'rsjob-%') OR
    (kind = 'difficulty_profile' AND id LIKE 'dpjob-%') OR
    (kind = 'tinker' AND id LIKE 'tinkjob-%') OR
    (kind = 'model_pull' AND id LIKE 'pulljob-%'));
DROP INDEX models_hub_id;
CREATE UNIQUE INDEX models_hub_id
    ON models (COALESCE(org_id, '00000000-0000-0000-0000-000000000000'::uuid), hub_id)
    WHERE hub_id IS NOT NULL;
