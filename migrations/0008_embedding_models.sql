-- Embedding models in the registry: `kind = 'embedding'` (a sentence-transformers folder, format
-- `hf`) that `text_similarity` graders with `cosine` name by id; not trainable nor servable.
ALTER TABLE models DROP CONSTRAINT models_kind_check;
ALTER TABLE models ADD CONSTRAINT models_kind_check
    CHECK (kind IN ('base', 'fine_tuned', 'embedding'));
