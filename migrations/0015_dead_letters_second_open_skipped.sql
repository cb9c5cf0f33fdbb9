-- +goose Up
-- A second open letter for one event generation becomes a no-op for every writer, including
-- the binaries of a release older than 0005, which keep running between `migrate up` and
-- the deploy. Those wrote letters without a conflict clause (the relay) or with one naming
-- only the per-QStash-message index (the failure callback), so 0005's unique index failed
-- their statements with 23505: a relay batch's whole outcome statement rolled back (its rows
-- went out again after the lease) and callbacks answered 500 until the new binaries ran.
-- A database upgraded from 0004 applies 0005 and this migration in one `migrate up`, so the
-- old binaries never meet the index without it. The current writers insert with ON CONFLICT
-- DO NOTHING and see the same outcome: nothing inserted. The unique index stays: two writers
-- racing past this check still meet it, and the current ones skip the row there.
--
-- Cost: one probe of dead_letters_one_open_idx per open letter written.
-- +goose StatementBegin
CREATE FUNCTION dead_letters_skip_second_open() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.resolved_at IS NULL AND NEW.outbox_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM dead_letters d
        WHERE d.outbox_id = NEW.outbox_id AND d.generation = NEW.generation AND d.resolved_at IS NULL)
    THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- Creating the trigger locks dead_letters against writes for an instant; the migration
-- runner's lock_timeout bounds the wait and retries (writers of dead letters only: producers
-- and the relay's claim never wait on it).
CREATE TRIGGER dead_letters_skip_second_open
    BEFORE INSERT ON dead_letters
    FOR EACH ROW EXECUTE FUNCTION dead_letters_skip_second_open();
