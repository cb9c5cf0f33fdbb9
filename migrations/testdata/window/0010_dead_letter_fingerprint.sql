-- +goose Up
-- A failure fingerprint on every dead letter, so an operator works through a thousand letters
-- as the three causes they are (outboxctl dlq list --group, dlq redrive --group FP).
--
-- The fingerprint is computed by the database, in a generated column: every writer (the
-- relay's dead-letter statement, the failure callback, dlq sync, a hand-made INSERT) gets it
-- without code, and rows written before this migration get it now (adding a STORED column
-- rewrites the table under an ACCESS EXCLUSIVE lock: seconds for a table of a few hundred
-- thousand letters; writers wait, nothing fails).

-- dead_letter_error_pattern is an error text with what differs between occurrences of one
-- cause replaced by placeholders, in this order: UUIDs (<uuid>), timestamps, dates and clock
-- times (<time>), 0x-prefixed hex and hex words of 8+ digits mixing digits and letters
-- (<hex>), identifiers of 16+ word characters containing a digit such as QStash message ids
-- (<id>), and numbers (<n>); then runs of white space become one space, and the result is cut
-- at 1000 characters. It must stay IMMUTABLE (generated columns require it). Changing it
-- later does not recompute stored rows: a migration that replaces it must also run
-- UPDATE dead_letters SET error = error.
CREATE FUNCTION dead_letter_error_pattern(err text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN left(btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
    err,
    '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
    '[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.,][0-9]+)?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)?)?|\m[0-9]{1,2}:[0-9]{2}:[0-9]{2}([.,][0-9]+)?', '<time>', 'gi'),
    '\m0x[0-9a-f]+\M', '<hex>', 'gi'),
    '\m(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\M', '<hex>', 'gi'),
    '\m(?=[a-z0-9_]*[0-9])[a-z0-9_]{16,}\M', '<id>', 'gi'),
    '[0-9]+([.][0-9]+)?', '<n>', 'g'),
    '\s+', ' ', 'g')), 1000);

-- error_pattern shows an operator what a group means; fingerprint names the group: the
-- first 16 hex digits (64 bits) of md5 over topic, source, status code and error pattern,
-- separated by a unit separator so ('a', 'b|c') and ('a|b', 'c') differ.
ALTER TABLE dead_letters
    ADD COLUMN error_pattern text NOT NULL
        GENERATED ALWAYS AS (dead_letter_error_pattern(error)) STORED,
    ADD COLUMN fingerprint text NOT NULL
        GENERATED ALWAYS AS (left(md5(
            coalesce(topic, '') || E'\x1f' || source || E'\x1f' || coalesce(status_code::text, '')
            || E'\x1f' || dead_letter_error_pattern(error)), 16)) STORED;

-- Grouping and redriving by fingerprint read open letters only, newest last.
CREATE INDEX dead_letters_fingerprint_open_idx
    ON dead_letters (fingerprint, created_at)
    WHERE resolved_at IS NULL;
