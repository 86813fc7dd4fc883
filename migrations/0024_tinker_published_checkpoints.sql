-- Published Tinker checkpoints (docs/tinker.md, "Publishing"): a saved path its org published
-- can be read by every org of the server through its `tinker://` path (sampling from it,
-- starting a training client from it, weights_info, external weights URLs) until it is
-- unpublished or deleted; only its own org changes or deletes it.
ALTER TABLE tinker_checkpoints ADD COLUMN public boolean NOT NULL DEFAULT false;

-- A sampling session opened on another org's published path: it samples through that path, so
-- unpublishing or deleting the path ends its access at the next call.
ALTER TABLE tinker_sampling_sessions ADD COLUMN model_path text;
