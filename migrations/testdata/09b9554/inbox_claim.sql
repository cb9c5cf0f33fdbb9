-- qClaim of pkg/inbox/queries.go at 09b9554 (git show 09b9554:pkg/inbox/queries.go), verbatim.
INSERT INTO processed_messages (consumer, message_id, payload_hash, retried)
VALUES ($1, $2, $3, $4::int)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING true
