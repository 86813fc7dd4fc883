-- `validating_files` was a job state that no code ever entered (jobs are created `queued`, their
-- files checked before the insert): drop it from the state CHECK and the transition rules. No row
-- can hold it; should one, stop here rather than guess what that job should become.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM jobs WHERE state = 'validating_files') THEN
        RAISE EXCEPTION 'jobs in state validating_files exist; move them to queued, failed or cancelled, then migrate again';
    END IF;
END $$;

ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN
    ('queued', 'running', 'paused', 'succeeded', 'failed', 'cancelled'));

-- Allowed state transitions; anything else raises.
CREATE OR REPLACE FUNCTION jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    IF NEW.state = OLD.state THEN
        RETURN NEW;
    END IF;
    IF NOT (
        (OLD.state = 'queued'  AND NEW.state IN ('running', 'paused', 'cancelled', 'failed')) OR
        (OLD.state = 'running' AND NEW.state IN ('queued', 'paused', 'succeeded', 'failed', 'cancelled')) OR
        (OLD.state = 'paused'  AND NEW.state IN ('queued', 'cancelled'))
    ) THEN
        RAISE EXCEPTION 'invalid job state transition % -> % for job %', OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'VT002';
    END IF;
    IF NEW.state = 'running' AND NEW.attempt <> OLD.attempt + 1 THEN
        RAISE EXCEPTION 'a claim must increment the attempt of job %', OLD.id USING ERRCODE = 'VT002';
    END IF;
    RETURN NEW;
END $$;
