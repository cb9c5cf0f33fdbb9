-- +goose NO TRANSACTION
-- +goose Up
-- The dispatched events of each key, newest last, for the webhook's key-order check
-- (pkg/webhook, keyorder.go): before it applies a delivery from a FIFO queue it looks up
-- the key's previous dispatched event and holds the delivery while that one is neither
-- applied nor dead-lettered (its delivery failed and it is on its way back through the
-- outbox). One index probe per delivery; without the index the same lookup walks the
-- primary key back to the key's previous event, which for a quiet key is the whole table,
-- so the webhook skips the check until this index exists.
--
-- Cost: one index entry per event, written with the mark (the producer's INSERT and the
-- claim write none: their rows are not dispatched yet).
--
-- Built CONCURRENTLY: producers and relays keep writing while it builds. A build that was
-- interrupted leaves an invalid index behind; the DROP removes it so the build starts
-- over (goose records the version only after both statements). Each statement waits for
-- the transactions open when it starts, under the migration runner's lock_timeout and
-- retries, like every other migration.
DROP INDEX CONCURRENTLY IF EXISTS outbox_dispatched_key_idx;

CREATE INDEX CONCURRENTLY outbox_dispatched_key_idx
    ON outbox (partition_key, id)
    WHERE dispatched_at IS NOT NULL AND dead_lettered_at IS NULL;
