-- qReschedule of pkg/outbox/queries.go at f2c9285 (git show f2c9285:pkg/outbox/queries.go), verbatim.
UPDATE outbox o
SET available_at = coalesce($5::timestamptz, now()) + u.delay_ms * interval '1 millisecond',
    locked_until = NULL, lease_token = NULL, last_error = u.err
FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS u(id, delay_ms, err)
WHERE o.id = u.id AND o.lease_token = $4
