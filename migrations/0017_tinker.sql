-- The Tinker API (docs/tinker.md): a client's session, the sampling sessions it opens on a
-- model, and the futures its calls return (polled with retrieve_future, from any API server).
CREATE TABLE tinker_sessions (
    id                 text PRIMARY KEY,
    org_id             uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    user_id            uuid REFERENCES users(id) ON DELETE SET NULL,
    tags               jsonb NOT NULL DEFAULT '[]',
    user_metadata      jsonb NOT NULL DEFAULT '{}',
    created_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz,
    finish_reason      text
);
CREATE INDEX tinker_sessions_org_idx ON tinker_sessions (org_id, created_at DESC);

CREATE TABLE tinker_sampling_sessions (
    id          text PRIMARY KEY,
    session_id  text NOT NULL REFERENCES tinker_sessions(id) ON DELETE CASCADE,
    org_id      uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    model       text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- A call's result: `content_type` and `result` once it succeeded, `error` once it failed.
CREATE TABLE tinker_futures (
    id            text PRIMARY KEY,
    org_id        uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    kind          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    content_type  text,
    result        bytea,
    error         jsonb
);
CREATE INDEX tinker_futures_created_idx ON tinker_futures (created_at);
