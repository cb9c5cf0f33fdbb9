-- +goose Up
-- generation is the outbox generation (redrives so far) a dead letter is about, 0 when
-- unknown. dlq sync records QStash DLQ entries of any generation, and an entry about a
-- generation the row has left behind (it was redriven since) is recorded as resolved
-- ('superseded'), so it never asks for a second redrive.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS generation integer NOT NULL DEFAULT 0;
