package bench

const (
	qReset = `TRUNCATE outbox, processed_messages, billing_charges, dead_letters RESTART IDENTITY`

	qVacuumOutbox = `VACUUM ANALYZE outbox`

	// qForgetOutboxStatistics makes the outbox look never analysed to the planner: no
	// column statistics and no row estimate (reltuples -1, what a new table has).
	qForgetOutboxStatistics = `
DO $$
BEGIN
    DELETE FROM pg_statistic WHERE starelid = 'outbox'::regclass;
    UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid = 'outbox'::regclass;
END $$`

	qPendingCount = `SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL`

	qDispatchedCount = `SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL`

	// qAppSessions counts the sessions of one application_name.
	qAppSessions = `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`

	// qWALPosition is the server's WAL insert position in bytes: the difference of two is
	// the WAL written in between, by every session of the server.
	qWALPosition = `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`

	// qCreatedAt reads the producer-side timestamps of the e2e events.
	qCreatedAt = `SELECT id, created_at FROM outbox WHERE id = ANY($1::bigint[])`

	qClockTimestamp = `SELECT clock_timestamp()`

	qTableSizes = `
SELECT pg_total_relation_size('outbox'), pg_relation_size('outbox'),
       pg_relation_size('outbox_ready_idx'), pg_relation_size('outbox_pkey'),
       pg_relation_size('outbox_pending_key_idx')`

	// The article's claim: the lease lives in locked_until, so claimed rows
	// stay at the front of outbox_ready_idx (filtered out one heap fetch at a time).
	qArticleClaim = `
UPDATE outbox o
SET locked_until = now() + $2::interval, attempts = o.attempts + 1
WHERE o.id IN (
    SELECT id FROM outbox
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL
      AND available_at <= now()
      AND (locked_until IS NULL OR locked_until < now())
    ORDER BY available_at, id
    FOR UPDATE SKIP LOCKED
    LIMIT $1)
RETURNING o.id, o.topic, o.partition_key, o.payload::text, o.headers, o.attempts`

	// The article's per-row outcome statements.
	qArticleMark       = `UPDATE outbox SET dispatched_at = now(), locked_until = NULL WHERE id = $1`
	qArticleDeadLetter = `UPDATE outbox SET dead_lettered_at = now(), locked_until = NULL, last_error = $2 WHERE id = $1`
	qArticleRetry      = `
UPDATE outbox
SET locked_until = NULL, available_at = now() + ($2 || ' seconds')::interval, last_error = $3
WHERE id = $1`
)
