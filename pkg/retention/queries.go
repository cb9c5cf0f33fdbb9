package retention

// Parameters shared by every statement: $1 now (NULL: the database clock), $2 the
// retention interval, $3 the batch size. Each delete is one statement on at most $3 rows
// found through an index, so it holds its row locks for milliseconds and never scans the
// table. Candidate rows are locked FOR UPDATE SKIP LOCKED first: a row that a redrive (or
// anything else) holds is skipped, not waited for, and a row updated since the statement
// began is re-checked against the conditions before it is deleted.
const (
	cutoff = `(coalesce($1::timestamptz, now()) - $2::interval)`

	// dispatchedWhere: published rows finished before the cutoff. A row that QStash later
	// failed to deliver (dead_lettered_at set by the failure callback) is kept while any of
	// its dead letters is unresolved, and until the cutoff has passed its dead-lettering
	// too. Leased rows never match (a lease is cleared when a row is marked); the check
	// guards against a future state that sets both.
	dispatchedWhere = `
    o.dispatched_at < ` + cutoff + `
    AND (o.dead_lettered_at IS NULL OR o.dead_lettered_at < ` + cutoff + `)
    AND o.lease_token IS NULL
    AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.outbox_id = o.id AND d.resolved_at IS NULL)`

	// qDeleteDispatched walks outbox_dispatched_idx oldest first.
	qDeleteDispatched = `
WITH victims AS (
    SELECT o.id FROM outbox o
    WHERE` + dispatchedWhere + `
    ORDER BY o.dispatched_at
    LIMIT $3
    FOR UPDATE OF o SKIP LOCKED
)
DELETE FROM outbox WHERE id = ANY (ARRAY(SELECT id FROM victims))`

	qCountDispatched = `SELECT count(*) FROM outbox o WHERE` + dispatchedWhere

	// deadLetteredFrom: rows the relay dead-lettered (never dispatched) whose dead letters
	// are all resolved (discarded or otherwise closed; a redrive puts the row back to
	// pending, so it no longer matches), resolved and dead-lettered before the cutoff.
	// It is driven from dead_letters (small: failures only) and probes the outbox by
	// primary key, because no outbox index covers finished-but-undispatched rows.
	deadLetteredFrom = `
    FROM dead_letters r
    JOIN outbox o ON o.id = r.outbox_id
    WHERE r.resolved_at < ` + cutoff + `
      AND o.dispatched_at IS NULL
      AND o.dead_lettered_at < ` + cutoff + `
      AND o.lease_token IS NULL
      AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.outbox_id = o.id AND d.resolved_at IS NULL)`

	qDeleteDeadLettered = `
WITH victims AS (
    SELECT o.id` + deadLetteredFrom + `
    LIMIT $3
    FOR UPDATE OF o SKIP LOCKED
)
DELETE FROM outbox WHERE id = ANY (ARRAY(SELECT DISTINCT id FROM victims))`

	qCountDeadLettered = `SELECT count(DISTINCT o.id)` + deadLetteredFrom

	// qDeleteProcessed walks processed_messages_processed_at_idx oldest first and deletes
	// by primary key.
	qDeleteProcessed = `
WITH victims AS (
    SELECT consumer, message_id FROM processed_messages
    WHERE processed_at < ` + cutoff + `
    ORDER BY processed_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
DELETE FROM processed_messages p
USING victims v
WHERE p.consumer = v.consumer AND p.message_id = v.message_id`

	qCountProcessed = `SELECT count(*) FROM processed_messages WHERE processed_at < ` + cutoff
)
