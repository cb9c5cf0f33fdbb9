-- +goose Up
-- The outbox trigger NOTIFYs only while a relay is asleep, so producer commits stop paying
-- for the wake-up. Postgres serialises the commits of every transaction that issued a NOTIFY
-- behind one global lock; with the trigger of 0001 (a NOTIFY per INSERT statement) the
-- producers lost most of their write throughput (pgbench, 64 clients, one event per
-- transaction: 1,850 commits/s against 10,113 with the trigger disabled), in the Lambda
-- deployment too, where nobody listens.
--
-- How the relay and the trigger agree (pkg/relay/linger.go): an idle long-lived relay first
-- polls fast (a few milliseconds, doubling), then goes to sleep by taking an exclusive
-- session advisory lock keyed (1868724343, the outbox's oid) on its LISTEN connection, drains
-- once more and waits for a notification (or its poll interval). The trigger asks for the
-- same key in shared mode, for the transaction, without waiting: granted means no relay is
-- asleep and nothing is sent; refused means one is, and it NOTIFYs as before. A relay that is
-- draining or polling holds no lock, so producers never take the notify lock while it
-- keeps up; a Lambda relay never sleeps this way, so nothing is ever sent to it.
--
-- No wake-up is lost: a producer that found no sleeper holds its shared lock until it
-- commits, so a relay cannot fall asleep (its try of the exclusive lock fails, it keeps
-- polling) until that event is committed, and the drain it runs after taking the lock sees
-- it. A session lock dies with its connection, so a crashed relay leaves nothing behind.
--
-- Measured costs: see README, Performance ("Producer commits").
--
-- Only the function body changes: the trigger of 0001 calls outbox_notify() by name, so no
-- lock on outbox is taken and producers never queue behind this migration. The lock_timeout
-- bounds the wait for the catalog row should another session be replacing the function too.
--
-- To keep the wake-up of 0001 (every insert statement NOTIFYs, whatever the relays do), at
-- its cost to producer throughput, run after this migration:
--   CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
--   BEGIN PERFORM pg_notify('outbox', ''); RETURN NULL; END; $$;
-- To drop the wake-up entirely (relays then find plain SQL inserts by polling alone):
--   DROP TRIGGER outbox_notify_insert ON outbox;
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(1868724343, TG_RELID::oid::int) THEN
        PERFORM pg_notify('outbox', '');
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
