-- +goose Up
-- One row per destination (topic) whose consumer is down: an open circuit. The failure
-- callback opens it when QStash gives up on a delivery for a transient reason (a 5xx, a
-- timeout: the consumer's outage, not the event's fault) and reopens that event in the
-- outbox; the relay then holds the topic's events in the outbox instead of feeding them to
-- QStash's retry ladder, publishes one probe event when probe_at comes, and deletes the row
-- (closes the circuit) once the probe is delivered. docs/reliability.md, "Consumer outage".
--
-- A new table: nothing on the producers' path waits for this migration, and binaries
-- older than it neither read nor write it (their failure callback dead-letters as before).
CREATE TABLE IF NOT EXISTS outbox_circuits (
    topic            text        PRIMARY KEY,
    opened_at        timestamptz NOT NULL DEFAULT now(),
    -- failures counts the transient final failures reported while the circuit was open;
    -- probe_failures the probes among them, which double the wait before the next probe.
    failures         integer     NOT NULL DEFAULT 1,
    probe_failures   integer     NOT NULL DEFAULT 0,
    -- No probe is published before probe_at.
    probe_at         timestamptz NOT NULL,
    -- The probe in flight: its outbox row and generation, and when it was published.
    probe_id         bigint,
    probe_generation integer,
    probe_sent_at    timestamptz,
    last_error       text
);
