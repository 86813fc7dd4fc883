-- API keys get what their creator chose: a role no higher than the owner's (NULL: the owner's)
-- and an optional expiry, after which the API refuses the key.
ALTER TABLE api_keys
    ADD COLUMN role text CHECK (role IN ('admin', 'member')),
    ADD COLUMN expires_at timestamptz;
