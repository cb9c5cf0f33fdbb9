-- qRelease of pkg/outbox/queries.go at f2c9285 (git show f2c9285:pkg/outbox/queries.go), verbatim.
UPDATE outbox
SET available_at = coalesce($3::timestamptz, now()), attempts = attempts - 1, locked_until = NULL, lease_token = NULL
WHERE id = ANY($1::bigint[]) AND lease_token = $2
