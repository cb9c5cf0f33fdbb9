package deadletter

// letterColumns is the column list every read returns, in scanLetter's order.
const letterColumns = `
d.id, d.source, d.outbox_id, coalesce(d.topic, ''), coalesce(d.partition_key, ''), d.payload::text, d.headers::text,
d.error, d.attempts, d.status_code, coalesce(d.qstash_message_id, ''), coalesce(d.qstash_dlq_id, ''),
coalesce(d.response_body, ''), d.created_at, d.resolved_at, coalesce(d.resolution, '')`

// filterWhere selects letters by a Filter. NULL parameters match everything:
// $1 ids, $2 topic, $3 partition key, $4 since (inclusive), $5 until (exclusive),
// $6 whether resolved letters match too.
const filterWhere = `
    ($1::bigint[] IS NULL OR d.id = ANY($1::bigint[]))
AND ($2::text IS NULL OR d.topic = $2::text)
AND ($3::text IS NULL OR d.partition_key = $3::text)
AND ($4::timestamptz IS NULL OR d.created_at >= $4::timestamptz)
AND ($5::timestamptz IS NULL OR d.created_at < $5::timestamptz)
AND ($6::bool OR d.resolved_at IS NULL)`

const (
	// qList returns matching letters newest first; $7 is the limit.
	qList = `SELECT` + letterColumns + `
FROM dead_letters d
WHERE` + filterWhere + `
ORDER BY d.created_at DESC, d.id DESC
LIMIT $7`

	qGet = `SELECT` + letterColumns + ` FROM dead_letters d WHERE d.id = $1`

	// qSelectForRedrive classifies the matching letters: resolved or not, and the state of
	// their outbox row (gone, pending, or finished: dispatched or dead-lettered). $7 locks
	// the letters (Redrive) or not (Plan), so two concurrent redrives do not both reset a row.
	qSelectForRedrive = `
SELECT d.id, d.outbox_id, d.resolved_at IS NOT NULL,
       o.id IS NOT NULL,
       o.id IS NOT NULL AND o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
FROM dead_letters d
LEFT JOIN outbox o ON o.id = d.outbox_id
WHERE` + filterWhere + `
ORDER BY d.id`
	qLockSuffix = `
FOR UPDATE OF d`

	// qResetOutbox puts finished outbox rows back to pending with a new generation, so
	// their QStash deduplication id changes (QStash would drop a reused one). Rows already
	// pending (being relayed) are left alone: resetting would void the live lease.
	qResetOutbox = `
UPDATE outbox
SET dispatched_at = NULL, dead_lettered_at = NULL, attempts = 0, available_at = now(),
    lease_token = NULL, locked_until = NULL, last_error = NULL, generation = generation + 1
WHERE id = ANY($1::bigint[]) AND (dispatched_at IS NOT NULL OR dead_lettered_at IS NOT NULL)
RETURNING id, generation`

	qResolve = `
UPDATE dead_letters
SET resolved_at = now(), resolution = $2
WHERE id = ANY($1::bigint[]) AND resolved_at IS NULL`

	// qRecordDelivery records one QStash failure callback and marks its outbox row, in one
	// statement (so atomically). ON CONFLICT without a target makes the insert a no-op (no
	// row returned, nothing updated) on either unique index: a repeated callback for the same
	// QStash message, or an event generation that already has an open letter (the relay's,
	// when both gave up on the same delivery).
	// Topic, partition key and headers come from the outbox row (headers from the row, not
	// from the callback, which may carry the relay's Authorization header); topic falls
	// back to the one in the destination URL when the row is gone. The payload is the
	// delivered body, falling back to the row's payload when that is not JSON.
	// The letter is about generation $10 (from the signed destination URL), else the row's
	// current one. The outbox row is marked only if this callback is about its current
	// generation and it is not already dead-lettered, so a late callback for a delivery that
	// was redriven since does not stop the redriven event.
	// row locks the outbox row before the insert touches an index, the order the relay's
	// dead-letter statement takes them in (row, then letter): in the opposite order the two
	// deadlock when they race for the same event.
	qRecordDelivery = `
WITH locked AS (
    SELECT o.topic, o.partition_key, o.payload, o.headers, o.generation
    FROM outbox o
    WHERE o.id = $1::bigint
    FOR UPDATE
), ins AS (
    INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts,
                              status_code, qstash_message_id, qstash_dlq_id, response_body, generation)
    SELECT 'delivery', $1::bigint, coalesce(o.topic, $2::text), o.partition_key,
           coalesce($3::jsonb, o.payload), coalesce(o.headers, '{}'::jsonb), $4::text, $5::int,
           $6::int, $7::text, nullif($8::text, ''), $9::text, coalesce($10::int, o.generation, 0)
    FROM (SELECT 1) AS one
    LEFT JOIN locked o ON true
    ON CONFLICT DO NOTHING
    RETURNING id, outbox_id, generation
), mark AS (
    UPDATE outbox o
    SET dead_lettered_at = now(), last_error = $4::text
    FROM ins
    WHERE o.id = ins.outbox_id AND o.dead_lettered_at IS NULL AND o.generation = ins.generation
    RETURNING o.id
)
SELECT ins.id, ins.outbox_id, (SELECT count(*) FROM mark) > 0 FROM ins`

	// qExistingLetter finds the letter that made qRecordDelivery a no-op: the one recorded
	// for this QStash message ($1), else the open letter of the event generation ($2, $3;
	// $3 NULL: the row's current generation).
	qExistingLetter = `
SELECT d.id
FROM dead_letters d
WHERE (d.source = 'delivery' AND d.qstash_message_id = $1)
   OR (d.outbox_id = $2::bigint AND d.resolved_at IS NULL
       AND d.generation = coalesce($3::int, (SELECT o.generation FROM outbox o WHERE o.id = $2::bigint), 0))
ORDER BY d.qstash_message_id IS NOT DISTINCT FROM $1 DESC, d.id
LIMIT 1`

	// qLegacyWindowOpen: migration 0007's window for deliveries published before the
	// identity moved into the signed URL.
	qLegacyWindowOpen = `SELECT coalesce((SELECT now() < accept_until FROM legacy_identity), false)`
)
