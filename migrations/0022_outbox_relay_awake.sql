-- +goose Up
-- Promises of a claim to come, so producers that kick the relay Lambda (package kick) can
-- skip the invoke while one is on its way. A row says: some relay will start a claim after
-- `until` (the database's clock), so every event committed before `until` is claimed
-- without another kick. A kicked relay writes one row per invocation while it drains and
-- keeps its `until` a second or so ahead; when it leaves it deletes the row, waits out
-- what was promised and claims once more. A producer's kicker writes the row keyed
-- kick_token before it sends an invoke (the relay it wakes stays its idle gap), so that
-- the other producers committing in the same instant do not each send one.
--
-- A relay that dies breaks its promise: events committed before its `until` wait for the
-- next kick or the schedule's tick (one second of commits at most; never lost).
--
-- A new table: nothing on the producers' path reads it (only kickers, off the commit
-- path); binaries older than it neither read nor write it, and a kicker or relay newer
-- than the database behaves as before it (every kick is sent).
CREATE TABLE IF NOT EXISTS outbox_relay_awake (
    token uuid        PRIMARY KEY,
    until timestamptz NOT NULL
);
