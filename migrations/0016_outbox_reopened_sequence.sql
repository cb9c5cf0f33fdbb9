-- +goose Up
-- A counter of outbox rows made pending again (a redrive, or any UPDATE that clears
-- dispatched_at or dead_lettered_at), so the relay's claim can bound its index walks and
-- still see such a row.
--
-- Why: under a pinned xmin horizon (a long report, an idle-in-transaction session, a replica
-- with hot_standby_feedback) no dead index entry can be removed, and every event the relay
-- leases and marks leaves two in the outbox's partial indexes. A claim that walks them from
-- the start grew with every event since the pin (measured: 195 ms per claim after 120,000
-- events, 116 ms of it in the per-key head probes). The relay now starts its walks near
-- where live rows begin (internal/outboxstore, walk.go): the ready index from a lower bound
-- on available_at, the head probes from a lower bound on the pending ids. A row reopened
-- below those bounds would be missed by the head probes of its key's later events; the relay
-- reads this sequence with every claim and drops its id bound for a while after it moves.
--
-- A sequence, not a table: nextval and reading last_value leave no row versions behind, so
-- reading it costs the same under a pinned horizon. The trigger fires only for the rows its
-- WHEN selects (a comparison of four columns per updated row; the relay's own updates never
-- clear those columns); old binaries' redrives, the console's and plain SQL are counted
-- alike.
--
-- Creating the trigger locks the outbox against writes for an instant; the migration
-- runner's lock_timeout bounds the wait and retries.
CREATE SEQUENCE outbox_reopened_seq;

-- +goose StatementBegin
CREATE FUNCTION outbox_count_reopened() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('outbox_reopened_seq');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_reopened
    AFTER UPDATE ON outbox
    FOR EACH ROW
    WHEN ((OLD.dispatched_at IS NOT NULL AND NEW.dispatched_at IS NULL)
       OR (OLD.dead_lettered_at IS NOT NULL AND NEW.dead_lettered_at IS NULL))
    EXECUTE FUNCTION outbox_count_reopened();
