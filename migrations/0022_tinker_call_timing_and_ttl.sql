-- How long the worker spent running each Tinker call (its own compute, without the queueing
-- and the protocol around it), so that a call's log shows both and the protocol's overhead can
-- be measured (docs/tinker.md). NULL for a call not yet run, or run before this column existed.
ALTER TABLE tinker_calls ADD COLUMN ran_ms integer;

-- When weights saved under a `tinker://` path expire (the SDK's `ttl_seconds` on a save, or
-- `set_checkpoint_ttl_from_tinker_path`); NULL: kept until deleted. The API server deletes
-- expired paths as a delete would.
ALTER TABLE tinker_checkpoints ADD COLUMN expires_at timestamptz;
CREATE INDEX tinker_checkpoints_expiry_idx ON tinker_checkpoints (expires_at)
    WHERE expires_at IS NOT NULL;
