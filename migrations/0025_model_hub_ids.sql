-- A model's hub id (docs/models.md, "Hub ids"): the `OWNER/NAME` a model was pulled from (or
-- imported as, `--hub-id`), accepted wherever a model name is (jobs, inference, Tinker clients,
-- judges) so that code written for the hub's names runs unchanged. One model per hub id.
ALTER TABLE models ADD COLUMN hub_id text;
CREATE UNIQUE INDEX models_hub_id ON models (hub_id) WHERE hub_id IS NOT NULL;
