package health

// Every statement reads the current schema's tables (search_path), so a report describes
// the deployment the connection points at. All run in one round trip (a pgx batch).
const (
	// qBacklog is the relay's per-invocation gauge: pending rows, how late the latest-to-go
	// ready event is, and the oldest pending row's age. Count and age come from
	// outbox_pending_age_idx (partial on pending rows), so the cost follows the backlog, not
	// the table's history.
	//
	// Lateness is how long an event has been ready (due) and unpublished. An event is due
	// from its available_at, unless a pending event of its key that was never tried is not
	// due yet: FIFO holds it behind that delayed event (see package relay), so it is not
	// late. The relay moves available_at (a lease's end, a backoff), so it is the due time
	// only for a row never tried (attempts 0, no lease); a tried row has been due at least
	// since it was created. Each of the two cases is one walk of an index in due order that
	// stops at the first row not held by a delay:
	//   - untried rows on outbox_ready_idx (available_at, id), available_at <= now;
	//   - tried or leased rows on outbox_pending_age_idx (created_at).
	// A delayed event that fails and is retried therefore counts from its creation.
	qBacklog = `
SELECT count(*),
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8,
       greatest(coalesce(extract(epoch FROM now() - least(
           (SELECT o.available_at FROM outbox o
            WHERE o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
              AND o.available_at <= now() AND o.attempts = 0 AND o.lease_token IS NULL
              AND NOT EXISTS (
                  SELECT 1 FROM outbox d
                  WHERE d.partition_key = o.partition_key AND d.id < o.id
                    AND d.dispatched_at IS NULL AND d.dead_lettered_at IS NULL
                    AND d.attempts = 0 AND d.lease_token IS NULL AND d.available_at > now())
            ORDER BY o.available_at, o.id
            LIMIT 1),
           (SELECT o.created_at FROM outbox o
            WHERE o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
              AND (o.attempts > 0 OR o.lease_token IS NOT NULL)
              AND NOT EXISTS (
                  SELECT 1 FROM outbox d
                  WHERE d.partition_key = o.partition_key AND d.id < o.id
                    AND d.dispatched_at IS NULL AND d.dead_lettered_at IS NULL
                    AND d.attempts = 0 AND d.lease_token IS NULL AND d.available_at > now())
            ORDER BY o.created_at
            LIMIT 1))), 0), 0)::float8
FROM outbox
WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL`

	// qQueue: the article's three questions (how many are pending, how old is the oldest,
	// which keep failing) plus lease states, in one pass over the pending rows. $1 is the
	// attempts count above which a row is flapping. A stuck lease is one that expired
	// without its relay marking the row: the relay died or lost the database mid-batch.
	qQueue = `
SELECT count(*),
       count(*) FILTER (WHERE available_at <= now() AND lease_token IS NULL),
       count(*) FILTER (WHERE lease_token IS NOT NULL AND locked_until >= now()),
       count(*) FILTER (WHERE lease_token IS NOT NULL AND locked_until < now()),
       count(*) FILTER (WHERE attempts > $1),
       coalesce(max(attempts), 0),
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8,
       coalesce((SELECT o.id FROM outbox o
                 WHERE o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL
                 ORDER BY o.created_at LIMIT 1), 0)
FROM outbox
WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL`

	// qDispatchedPerMinute counts dispatches in each of the last 60 whole minutes (the
	// current, partial minute last), zeros included. It reads outbox_dispatched_idx.
	qDispatchedPerMinute = `
WITH d AS (
    SELECT date_trunc('minute', dispatched_at) AS minute, count(*) AS n
    FROM outbox
    WHERE dispatched_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
)
SELECT array_agg(coalesce(d.n, 0) ORDER BY m.minute)
FROM generate_series(date_trunc('minute', now()) - interval '59 minutes', date_trunc('minute', now()), interval '1 minute') AS m(minute)
LEFT JOIN d ON d.minute = m.minute`

	// qDeadLetters groups unresolved dead letters by source and topic, largest group first.
	qDeadLetters = `
SELECT source, coalesce(topic, ''), count(*), min(created_at)
FROM dead_letters
WHERE resolved_at IS NULL
GROUP BY 1, 2
ORDER BY 3 DESC, 1, 2`

	// qTables sizes the outbox and processed_messages tables of the current schema.
	// Live and dead tuples come from the statistics collector (updated asynchronously, so
	// estimates). They are read with the pg_stat_get_* functions for the two tables, not
	// through pg_stat_user_tables, which aggregates over every relation of the database
	// first (measured: 51 ms against 3 to 9 ms on a test server whose catalog holds many
	// schemas; the values are the same, the view is defined with these functions).
	qTables = `
SELECT c.relname,
       pg_table_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid),
       pg_stat_get_live_tuples(c.oid), pg_stat_get_dead_tuples(c.oid),
       pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relname IN ('outbox', 'processed_messages') AND c.relkind IN ('r', 'p')`

	// qHorizon finds what holds back VACUUM's xmin horizon in this database: the oldest open
	// transaction (other than this session's), the oldest backend snapshot (backend_xmin),
	// replication slots (physical ones hold back every database) and prepared transactions.
	// Sessions of other roles show NULL xact_start/backend_xmin unless the reader has
	// pg_read_all_stats, so grant it to the role running status.
	qHorizon = `
WITH act AS (
    SELECT pid, coalesce(state, '') AS state, coalesce(application_name, '') AS app, xact_start, backend_xmin
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND (xact_start IS NOT NULL OR backend_xmin IS NOT NULL)
), oldest AS (
    SELECT pid, state, app, extract(epoch FROM now() - xact_start)::float8 AS age_s
    FROM act WHERE xact_start IS NOT NULL
    ORDER BY xact_start
    LIMIT 1
), slots AS (
    SELECT greatest(coalesce(age(xmin), 0), coalesce(age(catalog_xmin), 0)) AS xid_age
    FROM pg_replication_slots
    WHERE database IS NULL OR database = current_database()
), prepared AS (
    SELECT prepared, age(transaction) AS xid_age FROM pg_prepared_xacts WHERE database = current_database()
)
SELECT (SELECT count(*) FROM act WHERE xact_start IS NOT NULL),
       coalesce((SELECT age_s FROM oldest), 0),
       coalesce((SELECT pid FROM oldest), 0),
       coalesce((SELECT state FROM oldest), ''),
       coalesce((SELECT app FROM oldest), ''),
       coalesce((SELECT max(age(backend_xmin)) FROM act), 0)::bigint,
       coalesce((SELECT max(xid_age) FROM slots), 0)::bigint,
       (SELECT count(*) FROM prepared),
       coalesce((SELECT extract(epoch FROM now() - min(prepared)) FROM prepared), 0)::float8,
       coalesce((SELECT max(xid_age) FROM prepared), 0)::bigint`
)

// qAttempts counts QStash's delivery attempts over the last hour ($1 false) or day: of the
// messages consumers processed (Upstash-Retried + 1; a count recorded as unknown is one
// attempt) and of the deliveries QStash gave up on (delivery dead letters: their retries + 1).
// It reads processed_messages_processed_at_idx and the window of dead_letters.
const qAttempts = `
WITH p AS (
    SELECT count(*) FILTER (WHERE processed_at >= now() - interval '1 hour') AS hour_n,
           coalesce(sum(coalesce(retried, 0) + 1) FILTER (WHERE processed_at >= now() - interval '1 hour'), 0) AS hour_attempts,
           count(*) FILTER (WHERE processed_at >= now() - interval '1 hour' AND retried IS NULL) AS hour_unknown,
           count(*) AS day_n,
           coalesce(sum(coalesce(retried, 0) + 1), 0) AS day_attempts,
           count(*) FILTER (WHERE retried IS NULL) AS day_unknown
    FROM processed_messages
    WHERE processed_at >= now() - interval '1 day'
), l AS (
    SELECT count(*) FILTER (WHERE created_at >= now() - interval '1 hour') AS hour_n,
           coalesce(sum(coalesce(attempts, 0) + 1) FILTER (WHERE created_at >= now() - interval '1 hour'), 0) AS hour_attempts,
           count(*) AS day_n,
           coalesce(sum(coalesce(attempts, 0) + 1), 0) AS day_attempts
    FROM dead_letters
    WHERE source = 'delivery' AND created_at >= now() - interval '1 day'
)
SELECT p.hour_n, p.hour_attempts, p.hour_unknown, l.hour_n, l.hour_attempts,
       p.day_n, p.day_attempts, p.day_unknown, l.day_n, l.day_attempts
FROM p, l`
