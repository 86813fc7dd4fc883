-- A Tinker training client that went idle is parked: its worker saved its state (weights and
-- Adam's moments) as checkpoint `parked_checkpoint` of the client's queue row and left the row
-- `paused`; the next call queues it again and the worker that claims it restores that
-- checkpoint first (then clears the column). NULL: not parked.
ALTER TABLE tinker_models ADD COLUMN parked_checkpoint integer;

-- A parked client whose session finished has ended as it would have while held: `succeeded`.
-- Only Tinker clients may go from `paused` to `succeeded`; every other rule is unchanged (0004).
CREATE OR REPLACE FUNCTION jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    IF NEW.state = OLD.state THEN
        RETURN NEW;
    END IF;
    IF NOT (
        (OLD.state = 'queued'  AND NEW.state IN ('running', 'paused', 'cancelled', 'failed')) OR
        (OLD.state = 'running' AND NEW.state IN ('queued', 'paused', 'succeeded', 'failed', 'cancelled')) OR
        (OLD.state = 'paused'  AND NEW.state IN ('queued', 'cancelled')) OR
        (OLD.state = 'paused'  AND NEW.state = 'succeeded' AND OLD.kind = 'tinker')
    ) THEN
        RAISE EXCEPTION 'invalid job state transition % -> % for job %', OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'VT002';
    END IF;
    IF NEW.state = 'running' AND NEW.attempt <> OLD.attempt + 1 THEN
        RAISE EXCEPTION 'a claim must increment the attempt of job %', OLD.id USING ERRCODE = 'VT002';
    END IF;
    RETURN NEW;
END $$;
