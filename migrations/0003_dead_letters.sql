-- +goose Up
-- Every dead letter, from the relay (source 'relay') or from QStash's failure callback
-- (source 'delivery'), is one row here: one SELECT shows everything stuck.
CREATE TABLE dead_letters (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source             text        NOT NULL CHECK (source IN ('relay', 'delivery')),
    outbox_id          bigint,
    topic              text,
    partition_key      text,
    payload            jsonb,
    headers            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    error              text        NOT NULL,
    attempts           integer,
    status_code        integer,
    qstash_message_id  text,
    qstash_dlq_id      text,
    response_body      text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    resolved_at        timestamptz,
    resolution         text
);

-- A failure callback is recorded once per QStash message id, however often QStash sends it.
CREATE UNIQUE INDEX dead_letters_qstash_message_idx
    ON dead_letters (qstash_message_id)
    WHERE source = 'delivery' AND qstash_message_id IS NOT NULL;

CREATE INDEX dead_letters_unresolved_idx
    ON dead_letters (created_at)
    WHERE resolved_at IS NULL;

CREATE INDEX dead_letters_outbox_idx ON dead_letters (outbox_id);
