-- Recipes (Verity extension): ordered stages (fine-tuning jobs, rejection-sampling runs,
-- evaluations), each enqueued as an ordinary queue row when the stage before it succeeds
-- (verity_core::recipes, verity_server::recipes). A recipe row holds the stages as submitted;
-- recipe_stages holds, per stage, the queue row that runs it (planned before it is enqueued, so a
-- server that dies between the two enqueues the same id again instead of a second row).
CREATE TABLE recipes (
    id           text PRIMARY KEY CHECK (id LIKE 'recipe-%'),
    org_id       uuid NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    created_by   uuid REFERENCES users(id) ON DELETE SET NULL,
    name         text CHECK (length(name) BETWEEN 1 AND 200),
    spec         jsonb NOT NULL,
    -- The root base model of the recipe's first model (what `fresh_base` stages train).
    base_model   text NOT NULL,
    state        text NOT NULL DEFAULT 'running'
        CHECK (state IN ('running', 'paused', 'succeeded', 'failed', 'cancelled')),
    error        jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX recipes_org_idx ON recipes (org_id, created_at DESC, id DESC);
CREATE INDEX recipes_running_idx ON recipes (id) WHERE state = 'running';

CREATE TABLE recipe_stages (
    recipe_id  text NOT NULL REFERENCES recipes(id) ON DELETE CASCADE,
    position   integer NOT NULL CHECK (position >= 0),
    name       text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('fine_tuning_job', 'rejection_sampling', 'evaluation')),
    -- The queue row running the stage (its latest attempt); NULL until the stage is reached.
    job_id     text,
    -- Queue rows of earlier attempts (a resumed recipe runs a failed stage again).
    earlier_job_ids text[] NOT NULL DEFAULT '{}',
    -- A reinforcement stage's guard: the difficulty profile run on the model it starts from
    -- (planned like job_id), and whether the stage may start (the profile predicted enough
    -- groups with an advantage, or a user resumed the recipe it paused).
    guard_job_id text,
    guard_passed boolean NOT NULL DEFAULT false,
    PRIMARY KEY (recipe_id, position),
    UNIQUE (recipe_id, name)
);
