-- +goose NO TRANSACTION
-- +goose Up
-- outbox.headers must be a JSON object whose values are all strings: they become HTTP
-- headers, and a row the relay cannot decode ({"x-n": 1} written by a hand-made INSERT or a
-- producer in another language) must be refused when it is written, not found when it is
-- claimed.
--
-- The migration works on a table that already holds rows, without holding a lock that
-- blocks producers while it scans: it runs outside a transaction, in three steps that are
-- each safe to run again (if it stops half way, run `outboxctl migrate` again).
--
-- 1. Add the constraint NOT VALID: from here on every INSERT and UPDATE is checked; rows
--    already there are not (a brief ACCESS EXCLUSIVE lock, no scan).
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'outbox_headers_strings' AND conrelid = 'outbox'::regclass
    ) THEN
        ALTER TABLE outbox ADD CONSTRAINT outbox_headers_strings
            CHECK (jsonb_typeof(headers) = 'object'
                   AND NOT jsonb_path_exists(headers, '$.* ? (@.type() != "string")'))
            NOT VALID;
    END IF;
END
$$;
-- +goose StatementEnd

-- 2. Repair the rows written before: every value that is not a string becomes its JSON text
--    ({"x-n": 1} -> {"x-n": "1"}); headers that are not an object become {}. A repaired row
--    that was still pending is dead-lettered (source 'relay') instead of published with
--    headers its producer did not write: the letter's error quotes the original headers
--    (first 1000 characters). Then, for each letter:
--      outboxctl dlq show <id>       read the original headers
--      outboxctl dlq redrive <id>    publish with the repaired headers (or leave it open:
--                                    retention keeps a row with an open letter)
--    Rows already dispatched or dead-lettered are only repaired. Leased rows are taken over
--    (their relay's later updates are fenced off by the lease token).
WITH bad AS (
    SELECT o.id,
           o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL AS pending,
           left(o.headers::text, 1000) AS original,
           CASE WHEN jsonb_typeof(o.headers) = 'object' THEN (
               SELECT coalesce(jsonb_object_agg(e.key, CASE WHEN jsonb_typeof(e.value) = 'string'
                                                            THEN e.value ELSE to_jsonb(e.value::text) END),
                               '{}'::jsonb)
               FROM jsonb_each(o.headers) e)
           ELSE '{}'::jsonb END AS repaired
    FROM outbox o
    WHERE NOT (jsonb_typeof(o.headers) = 'object'
               AND NOT jsonb_path_exists(o.headers, '$.* ? (@.type() != "string")'))
    FOR UPDATE OF o
), fixed AS (
    UPDATE outbox o
    SET headers          = bad.repaired,
        dead_lettered_at = CASE WHEN bad.pending THEN now() ELSE o.dead_lettered_at END,
        last_error       = CASE WHEN bad.pending
                                THEN 'headers ' || bad.original || ' are not a JSON object of string values; '
                                     || 'migration 0006 converted the values to strings and dead-lettered the row: '
                                     || 'redrive it (outboxctl dlq redrive) to publish the converted headers'
                                ELSE o.last_error END,
        lease_token      = CASE WHEN bad.pending THEN NULL ELSE o.lease_token END,
        locked_until     = CASE WHEN bad.pending THEN NULL ELSE o.locked_until END
    FROM bad
    WHERE o.id = bad.id
    RETURNING o.id, o.topic, o.partition_key, o.payload, o.headers, o.attempts, o.generation, o.last_error, bad.pending
)
INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts, generation)
SELECT 'relay', id, topic, partition_key, payload, headers, last_error, attempts, generation
FROM fixed
WHERE pending
ON CONFLICT DO NOTHING;

-- 3. Check the rows written before; takes a lock that lets producers and relays go on.
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_headers_strings;
