-- +goose Up
-- The outbox: one row per event, written in the producer's business transaction.
-- Lifecycle: pending (dispatched_at and dead_lettered_at NULL) -> dispatched | dead-lettered.
-- A claimed row carries lease_token and has available_at/locked_until moved to the lease's end,
-- so it leaves the front of outbox_ready_idx while a relay publishes it.
CREATE TABLE outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic            text        NOT NULL,
    partition_key    text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    available_at     timestamptz NOT NULL DEFAULT now(),
    dispatched_at    timestamptz,
    dead_lettered_at timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    locked_until     timestamptz,
    lease_token      uuid,
    last_error       text,
    -- generation counts redrives; it makes the QStash deduplication id of a redriven
    -- event differ from the one QStash may still remember (outbox-<id>-r<generation>).
    generation       integer     NOT NULL DEFAULT 0,
    CONSTRAINT outbox_topic_len CHECK (length(topic) BETWEEN 1 AND 128),
    CONSTRAINT outbox_partition_key_len CHECK (length(partition_key) BETWEEN 1 AND 256)
);

-- Partial index: only rows the relay can ever care about. Its size does not grow with history.
CREATE INDEX outbox_ready_idx
    ON outbox (available_at, id)
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL;

-- Observability helper: oldest pending age without a scan.
CREATE INDEX outbox_pending_age_idx
    ON outbox (created_at)
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL;

-- Per-key head lookups for FIFO: "the first pending ids of this partition key".
CREATE INDEX outbox_pending_key_idx
    ON outbox (partition_key, id)
    WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL;

-- Retention deletes dispatched rows oldest first in small batches.
CREATE INDEX outbox_dispatched_idx
    ON outbox (dispatched_at)
    WHERE dispatched_at IS NOT NULL;

-- One wake-up per INSERT statement (not per row); NOTIFY also collapses identical
-- notifications within a transaction, so a transaction wakes the relay once.
-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_notify_insert
    AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
