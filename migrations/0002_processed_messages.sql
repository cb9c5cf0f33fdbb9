-- +goose Up
-- Consumer-side deduplication: one row per (consumer, message id), inserted in the same
-- transaction as the consumer's side effects.
CREATE TABLE processed_messages (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    -- sha256 of the delivered body; the same id with a different hash is an upstream bug.
    payload_hash bytea,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Retention deletes by age.
CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at);
