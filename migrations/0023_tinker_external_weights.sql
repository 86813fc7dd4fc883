-- Weights saved in an external format (`save_weights_external`): the client's weights as a
-- Hugging Face folder (or PEFT adapter), downloadable file by file through signed URLs.
ALTER TABLE tinker_checkpoints DROP CONSTRAINT tinker_checkpoints_kind_check;
ALTER TABLE tinker_checkpoints ADD CONSTRAINT tinker_checkpoints_kind_check
    CHECK (kind IN ('training', 'sampler', 'external'));
