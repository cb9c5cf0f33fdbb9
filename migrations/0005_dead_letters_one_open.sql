-- +goose Up
-- At most one open dead letter per event generation. The relay and the failure callback can
-- both give up on the same delivery (a 489 answered while the relay still holds the row, or
-- both retry budgets running out together); whichever writes second adds nothing, so one
-- failure is one letter to look at and one row to redrive.
--
-- generation is the outbox generation the letter is about (outbox.generation: redrives so
-- far), 0 when unknown. Written before this migration: 0 for every letter.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS generation integer NOT NULL DEFAULT 0;

-- An open letter written before this migration is about its row's current generation: a
-- redrive resolves the letters it replays before it raises the generation.
UPDATE dead_letters d
SET generation = o.generation
FROM outbox o
WHERE o.id = d.outbox_id AND d.resolved_at IS NULL AND d.generation <> o.generation;

-- A deployed table may already hold two open letters for one event (the bug this index
-- ends). The oldest one stays open; the others are resolved as 'duplicate', not deleted, so
-- `outboxctl dead-letters list --all` still shows what they said. If a relay or callback
-- still running the previous release adds a duplicate between this statement and the next,
-- the index build fails and the whole migration rolls back: run it again.
UPDATE dead_letters d
SET resolved_at = now(), resolution = 'duplicate'
WHERE d.resolved_at IS NULL AND d.outbox_id IS NOT NULL
  AND EXISTS (
      SELECT 1 FROM dead_letters k
      WHERE k.outbox_id = d.outbox_id AND k.generation = d.generation
        AND k.resolved_at IS NULL AND k.id < d.id);

-- Both writers insert with ON CONFLICT DO NOTHING and no conflict target, so this index and
-- the per-QStash-message one each turn a second letter into a no-op.
CREATE UNIQUE INDEX IF NOT EXISTS dead_letters_one_open_idx
    ON dead_letters (outbox_id, generation)
    WHERE resolved_at IS NULL AND outbox_id IS NOT NULL;
