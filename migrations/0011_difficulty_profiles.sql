-- Difficulty profiles (Verity extension): a third kind of sampling run on the job queue, k base
-- completions per prompt of a subset of a job's training file, with their pass rates, the
-- predicted zero-advantage fraction and a cost estimate (`dpjob-…` ids).
ALTER TABLE jobs DROP CONSTRAINT jobs_kind_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_kind_check
    CHECK (kind IN ('fine_tuning', 'evaluation', 'rejection_sampling', 'difficulty_profile'));
ALTER TABLE jobs DROP CONSTRAINT jobs_id_kind;
ALTER TABLE jobs ADD CONSTRAINT jobs_id_kind CHECK (
    (kind = 'fine_tuning' AND id LIKE 'ftjob-%') OR
    (kind = 'evaluation' AND id LIKE 'evaljob-%') OR
    (kind = 'rejection_sampling' AND id LIKE 'rsjob-%') OR
    (kind = 'difficulty_profile' AND id LIKE 'dpjob-%'));
