-- A Tinker session's optional display name (the SDK's `create_session(display_name=…)`), which
-- `GET /api/v1/sessions/{id}` and the dashboard show. Not unique; for people.
ALTER TABLE tinker_sessions ADD COLUMN display_name text
    CHECK (display_name IS NULL OR char_length(display_name) BETWEEN 1 AND 256);
