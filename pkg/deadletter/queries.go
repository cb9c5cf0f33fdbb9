package deadletter

// letterColumns is the column list every read returns, in scanLetter's order.
const letterColumns = `
d.id, d.source, d.outbox_id, coalesce(d.topic, ''), coalesce(d.partition_key, ''), d.payload::text, d.headers::text,
d.error, d.attempts, d.status_code, coalesce(d.qstash_message_id, ''), coalesce(d.qstash_dlq_id, ''),
coalesce(d.response_body, ''), d.created_at, d.resolved_at, coalesce(d.resolution, ''), d.fingerprint`

// filterWhere selects letters by a Filter. NULL parameters match everything:
// $1 ids, $2 topic, $3 partition key, $4 since (inclusive), $5 until (exclusive),
// $6 whether resolved letters match too, $7 fingerprint.
const filterWhere = `
    ($1::bigint[] IS NULL OR d.id = ANY($1::bigint[]))
AND ($2::text IS NULL OR d.topic = $2::text)
AND ($3::text IS NULL OR d.partition_key = $3::text)
AND ($4::timestamptz IS NULL OR d.created_at >= $4::timestamptz)
AND ($5::timestamptz IS NULL OR d.created_at < $5::timestamptz)
AND ($6::bool OR d.resolved_at IS NULL)
AND ($7::text IS NULL OR d.fingerprint = $7::text)`

const (
	// qList returns matching letters newest first; $8 is the limit.
	qList = `SELECT` + letterColumns + `
FROM dead_letters d
WHERE` + filterWhere + `
ORDER BY d.created_at DESC, d.id DESC
LIMIT $8`

	qGet = `SELECT` + letterColumns + ` FROM dead_letters d WHERE d.id = $1`

	// qGroups groups the matching letters by failure fingerprint, largest group first; $8 is
	// the limit. The newest letter of a group (max id) is its sample.
	qGroups = `
WITH g AS (
    SELECT d.fingerprint, d.topic, d.source, d.status_code, d.error_pattern,
           count(*) AS n, count(*) FILTER (WHERE d.resolved_at IS NULL) AS open,
           min(d.created_at) AS first_seen, max(d.created_at) AS last_seen, max(d.id) AS sample_id
    FROM dead_letters d
    WHERE` + filterWhere + `
    GROUP BY d.fingerprint, d.topic, d.source, d.status_code, d.error_pattern
)
SELECT g.fingerprint, coalesce(g.topic, ''), g.source, g.status_code, g.error_pattern, g.n, g.open,
       g.first_seen, g.last_seen, g.sample_id, s.error
FROM g
JOIN dead_letters s ON s.id = g.sample_id
ORDER BY g.n DESC, g.last_seen DESC, g.fingerprint
LIMIT $8`

	// qSelectForRedrive classifies the matching letters: resolved or not, and the state of
	// their outbox row (gone, pending, or finished: dispatched or dead-lettered). qLockSuffix locks
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
	// statement (so atomically). ON CONFLICT on the partial unique index makes a repeated
	// callback for the same QStash message a no-op: no row returned, nothing updated.
	// Topic, partition key and headers come from the outbox row (headers from the row, not
	// from the callback, which may carry the relay's Authorization header); topic falls
	// back to the one in the destination URL when the row is gone. The payload is the
	// delivered body, falling back to the row's payload when that is not JSON.
	// The outbox row is marked only if this callback is about its current generation
	// ($11, when known) and it is not already dead-lettered, so a late callback for a
	// delivery that was redriven since does not stop the redriven event.
	qRecordDelivery = `
WITH ins AS (
    INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, headers, error, attempts,
                              status_code, qstash_message_id, qstash_dlq_id, response_body)
    SELECT 'delivery', $1::bigint, coalesce(o.topic, $2::text), o.partition_key,
           coalesce($3::jsonb, o.payload), coalesce(o.headers, '{}'::jsonb), $4::text, $5::int,
           $6::int, $7::text, nullif($8::text, ''), $9::text
    FROM (SELECT 1) AS one
    LEFT JOIN outbox o ON o.id = $1::bigint
    ON CONFLICT (qstash_message_id) WHERE source = 'delivery' AND qstash_message_id IS NOT NULL DO NOTHING
    RETURNING id, outbox_id
), mark AS (
    UPDATE outbox o
    SET dead_lettered_at = now(), last_error = $4::text
    FROM ins
    WHERE o.id = ins.outbox_id AND o.dead_lettered_at IS NULL
      AND ($10::int IS NULL OR o.generation = $10::int)
    RETURNING o.id
)
SELECT ins.id, ins.outbox_id, (SELECT count(*) FROM mark) > 0 FROM ins`

	qLetterByMessage = `SELECT id FROM dead_letters WHERE source = 'delivery' AND qstash_message_id = $1`
)
