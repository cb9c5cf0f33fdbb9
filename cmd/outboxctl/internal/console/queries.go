package console

// The console's own statements: what internal/health and pkg/deadletter do not already answer.
// Every one is fixed text; request input only ever reaches them as parameters, and an
// unset filter is a NULL parameter. They run with pgx.QueryExecModeExec (an unnamed
// statement planned with the actual values), so a NULL filter folds away at plan time and
// the index conditions stay usable; a cached generic plan could not use them.
const (
	// qSnapshot makes the overview's transaction one read-only snapshot: the chart's
	// pending history rests on the report's pending count.
	qSnapshot = `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`

	// The chart's statements return the rows that were pending at some time since $1,
	// grouped by the bucket they became pending in (cb) and the bucket they stopped being
	// pending in (db, NULL while still pending), with their count and oldest created_at.
	// Buckets are date_bin starts (integer arithmetic; extract(epoch) would be numeric,
	// several times slower per row). None reads the outbox's history. $1 is the start of
	// the first bucket not cached (chartCache), $2 the bucket width. kind: 0 pending,
	// 1 dispatched, 2 dead-lettered, 3 the oldest pending row (count 0).
	//
	// qChartPending: rows still pending that were created since $1 (a range of
	// outbox_pending_age_idx, partial: the backlog only), the oldest pending row (one probe
	// of it), and rows dead-lettered since $1 (their open dead letters through
	// dead_letters_unresolved_idx, then the outbox primary key). The rows pending since
	// before $1 are not read: they are the report's pending count minus those created
	// since, read in the same snapshot.
	qChartPending = `
SELECT 0 AS kind, date_bin($2::interval, o.created_at, $1::timestamptz) AS cb, NULL::timestamptz AS db,
       count(*), min(o.created_at)
FROM outbox o
WHERE o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL AND o.created_at >= $1::timestamptz
GROUP BY 2
UNION ALL
(SELECT 3, o.created_at, NULL::timestamptz, 0::bigint, o.created_at
 FROM outbox o
 WHERE o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
 ORDER BY o.created_at
 LIMIT 1)
UNION ALL
SELECT 2, date_bin($2::interval, o.created_at, $1::timestamptz), date_bin($2::interval, o.dead_lettered_at, $1::timestamptz),
       count(*), min(o.created_at)
FROM outbox o
WHERE o.id IN (SELECT d.outbox_id FROM dead_letters d
               WHERE d.resolved_at IS NULL AND d.created_at >= $1::timestamptz)
  AND o.dead_lettered_at >= $1::timestamptz
GROUP BY 2, 3`

	// qChartDispatched: rows dispatched since $1 (outbox_dispatched_idx range). Its cost
	// follows the dispatches since $1: the whole window once, then the minutes since the
	// last cached bucket.
	qChartDispatched = `
SELECT 1, date_bin($2::interval, o.created_at, $1::timestamptz), date_bin($2::interval, o.dispatched_at, $1::timestamptz),
       count(*), min(o.created_at)
FROM outbox o
WHERE o.dispatched_at >= $1::timestamptz
GROUP BY 2, 3`

	// letterWhere is the dead-letter filter of the list pages: $1 topic, $2 partition key,
	// $3 source, $4 since (inclusive), $5 until (exclusive), $6 failure group (fingerprint);
	// NULL matches everything. The keyset cursor is $7 (created_at) and $8 (id) of the
	// last row shown: the next page starts strictly after it in (created_at DESC, id DESC)
	// order. It is written as created_at <= $7 AND (...) so that the bound is an index
	// condition. A group of open letters is read on dead_letters_fingerprint_open_idx.
	letterWhere = `
    ($1::text IS NULL OR d.topic = $1::text)
AND ($2::text IS NULL OR d.partition_key = $2::text)
AND ($3::text IS NULL OR d.source = $3::text)
AND ($4::timestamptz IS NULL OR d.created_at >= $4::timestamptz)
AND ($5::timestamptz IS NULL OR d.created_at < $5::timestamptz)
AND ($6::text IS NULL OR d.fingerprint = $6::text)
AND ($7::timestamptz IS NULL OR (d.created_at <= $7::timestamptz AND (d.created_at < $7::timestamptz OR d.id < $8::bigint)))`

	// qOpenLetterIDs pages open letters, newest first, on dead_letters_unresolved_idx.
	// $9 is the page size. The rows themselves are read with deadletter.List by id.
	qOpenLetterIDs = `
SELECT d.id FROM dead_letters d
WHERE d.resolved_at IS NULL AND` + letterWhere + `
ORDER BY d.created_at DESC, d.id DESC
LIMIT $9`

	// qAllLetterIDs is qOpenLetterIDs including resolved letters.
	qAllLetterIDs = `
SELECT d.id FROM dead_letters d
WHERE` + letterWhere + `
ORDER BY d.created_at DESC, d.id DESC
LIMIT $9`

	// qOpenLetterIDsAll returns every open letter id matching the filter, for a redrive by
	// filter that also selects by source (deadletter.Filter has no source): $7 and $8 are
	// NULL, $9 caps the selection.
	qOpenLetterIDsAll = `
SELECT d.id FROM dead_letters d
WHERE d.resolved_at IS NULL AND` + letterWhere + `
ORDER BY d.id
LIMIT $9`

	// qEvent reads one outbox row by primary key.
	qEvent = `
SELECT o.id, o.topic, o.partition_key, o.payload::text, o.headers::text, o.created_at, o.available_at,
       o.dispatched_at, o.dead_lettered_at, o.attempts, o.locked_until, coalesce(o.lease_token::text, ''),
       coalesce(o.last_error, ''), o.generation
FROM outbox o
WHERE o.id = $1`

	// qDedupe finds the dedupe records of one message id for every consumer. The primary
	// key is (consumer, message_id), so it walks the distinct consumers on it (a loose
	// index scan: one probe per consumer) and probes each (consumer, $1).
	qDedupe = `
WITH RECURSIVE c AS (
    (SELECT p.consumer FROM processed_messages p ORDER BY p.consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT p.consumer FROM processed_messages p WHERE p.consumer > c.consumer ORDER BY p.consumer LIMIT 1)
    FROM c WHERE c.consumer IS NOT NULL
)
SELECT p.consumer, coalesce(encode(p.payload_hash, 'hex'), ''), p.processed_at
FROM c
JOIN processed_messages p ON p.consumer = c.consumer AND p.message_id = $1::text
ORDER BY p.consumer`

	// qEventLetterIDs lists the dead letters of one outbox row on dead_letters_outbox_idx.
	qEventLetterIDs = `SELECT d.id FROM dead_letters d WHERE d.outbox_id = $1 ORDER BY d.id DESC LIMIT 100`
)
