-- Metrics announcements: API servers cache each job's rendered metrics and drop them when the
-- job's id arrives on the job change channel, so every write to a job's metrics rows announces
-- the job too (Postgres folds repeated announcements within one transaction into one).
CREATE FUNCTION announce_job_metrics_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('verity_job_changes', OLD.job_id);
    ELSE
        PERFORM pg_notify('verity_job_changes', NEW.job_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER job_metrics_announce_change AFTER INSERT OR UPDATE OR DELETE ON job_metrics
    FOR EACH ROW EXECUTE FUNCTION announce_job_metrics_change();
