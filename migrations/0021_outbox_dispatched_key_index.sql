-- +goose Up
-- The dispatched events of each key, newest last, for the webhook's key-order check
-- (pkg/webhook, keyorder.go): before it applies a delivery from a FIFO queue it looks up
-- the key's previous dispatched event and holds the delivery while that one is neither
-- applied nor dead-lettered (its delivery failed and it is on its way back through the
-- outbox). One index probe per delivery; without the index the same lookup walks the
-- primary key back to the key's previous event, which for a quiet key is the whole table,
-- so the webhook skips the check until this index exists.
--
-- Cost: one index entry per event, written with the mark.
--
-- Built under a SHARE lock, in the migration's transaction, under the runner's lock_timeout
-- and retries: producers wait for the build. CONCURRENTLY would spare them, but it waits for
-- every older snapshot in the whole database, and beside long transactions it failed the
-- runner's lock_timeout (the test suite's schemas, each migrated beside the others'
-- transactions, failed so). On a large outbox, build it by hand first, beside the
-- producers, and this statement then does nothing:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_dispatched_key_idx ON outbox (partition_key, id)
--       WHERE dispatched_at IS NOT NULL AND dead_lettered_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_dispatched_key_idx
    ON outbox (partition_key, id)
    WHERE dispatched_at IS NOT NULL AND dead_lettered_at IS NULL;
