-- qMarkDispatched of pkg/outbox/queries.go at f2c9285 (git show f2c9285:pkg/outbox/queries.go), verbatim.
UPDATE outbox
SET dispatched_at = coalesce($3::timestamptz, now()), locked_until = NULL, lease_token = NULL,
    last_error = CASE WHEN dead_lettered_at IS NULL THEN NULL ELSE last_error END
WHERE id = ANY($1::bigint[]) AND lease_token = $2
