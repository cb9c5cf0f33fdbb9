-- +goose Up
-- available_at defaults to the time of the INSERT statement (clock_timestamp()) instead of
-- the start of the producer's transaction (now()).
--
-- Why: a row becomes visible when its transaction commits, and the relay's claim walks the
-- ready index only from a little before the present (internal/outboxstore, walk.go), so
-- that under a pinned xmin horizon it passes the dead entries of the last second, not of
-- every event since the pin. A row whose available_at lies further back than that when it
-- becomes visible is found by the relay's periodic probe instead, seconds later. With
-- now(), a transaction that does a second of work before inserting its event produced
-- such a row every time; with the statement's time, only the time between the INSERT and
-- the COMMIT counts, which is where an outbox insert's transaction usually ends.
-- Enqueue and EnqueueBatch write the same value (their coalesce) since this release;
-- older producers' now() is still accepted, only found later when their transactions
-- are long.
--
-- Changing a default rewrites nothing; it takes ACCESS EXCLUSIVE on outbox for an
-- instant, under the migration runner's lock_timeout and retries.
ALTER TABLE outbox ALTER COLUMN available_at SET DEFAULT clock_timestamp();

