-- qClaim of pkg/inbox/queries.go at f2c9285 (git show f2c9285:pkg/inbox/queries.go), verbatim.
INSERT INTO processed_messages (consumer, message_id, payload_hash)
VALUES ($1, $2, $3)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING true
