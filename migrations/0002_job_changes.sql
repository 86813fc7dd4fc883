-- Job change announcements: API servers cache job rows and drop a copy when its job's id arrives
-- on this channel (verity_core::change_feed). Inserts need no announcement: nothing can have
-- cached a job before it exists.
CREATE FUNCTION announce_job_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('verity_job_changes', OLD.id);
    ELSE
        PERFORM pg_notify('verity_job_changes', NEW.id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_announce_change AFTER UPDATE OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION announce_job_change();
