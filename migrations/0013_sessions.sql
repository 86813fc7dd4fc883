-- Dashboard sessions. The cookie holds a random id; the server keeps only its SHA-256, with the
-- user, the API key the session was opened with (NULL: a password) and its expiry. Signing out
-- revokes the row, and every request re-reads the user's and the key's current state with it.
CREATE TABLE sessions (
    id_hash     bytea PRIMARY KEY CHECK (length(id_hash) = 32),
    user_id     uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    key_id      uuid REFERENCES api_keys(id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);
CREATE INDEX sessions_user_idx ON sessions (user_id);
CREATE INDEX sessions_expires_idx ON sessions (expires_at);

-- A user whose role or org changes, or who is deleted, is announced on the channel of key
-- revocations (payload 'user:<id>'), so that every server drops what it cached about the user
-- (verified keys, the role checked against tokens).
CREATE FUNCTION announce_user_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('verity_api_key_revoked', 'user:' || OLD.id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER users_announce_change AFTER UPDATE OF role, org_id OR DELETE ON users
    FOR EACH ROW EXECUTE FUNCTION announce_user_change();
