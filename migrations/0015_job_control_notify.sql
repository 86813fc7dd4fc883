-- A cancel or pause request wakes the worker that runs the job at once (verity_core::queue::
-- JobWaker relays the job id on this channel to the job's heartbeat), instead of at its next
-- heartbeat: cancelling takes effect within seconds in every phase.
CREATE FUNCTION announce_job_control() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('verity_job_control', NEW.id);
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_announce_control AFTER UPDATE OF control ON jobs
    FOR EACH ROW WHEN (NEW.control IS DISTINCT FROM OLD.control AND NEW.control <> 'none')
    EXECUTE FUNCTION announce_job_control();
