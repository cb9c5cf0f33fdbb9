-- +goose Up
-- The outbox trigger NOTIFYs only while a relay is asleep, so producer commits stop paying
-- for the wake-up. Postgres serialises the commits of every transaction that issued a NOTIFY
-- behind one global lock; with the trigger of 0001 (a NOTIFY per INSERT statement) producers
-- lost most of their write throughput (pgbench, 64 clients, one event per transaction:
-- 1,850 commits/s against 10,113 with the trigger disabled), in the Lambda deployment too,
-- where nobody listens.
--
-- How the relay and the trigger agree (pkg/relay/linger.go): an idle long-lived relay first
-- polls fast (1 ms, doubling), then goes to sleep by taking an exclusive session advisory
-- lock keyed (1868724343, the outbox's oid) on its LISTEN connection, drains once more and
-- waits for a notification (or its poll interval). The trigger's WHEN asks for the same key
-- in shared mode, for the transaction, without waiting: granted means no relay is asleep,
-- and the trigger does not fire at all (no function call, no queued trigger event); refused
-- means one is, and outbox_notify() sends the NOTIFY of 0001. A relay that is draining or
-- polling holds no lock, so producers never take the notify lock while it keeps up; a
-- Lambda relay without LINGER never sleeps this way, so nothing is sent to it.
--
-- No wake-up is lost: a producer that found no sleeper holds its shared lock until it
-- commits, so a relay cannot fall asleep (its try of the exclusive lock fails and it keeps
-- polling) until that event is committed, and the drain it runs after taking the lock sees
-- it. A session lock dies with its connection, so a relay that dies leaves nothing behind.
-- The relay must reach Postgres directly or through a session pooler: behind a transaction
-- pooler neither LISTEN nor a session lock holds (the relay then polls).
--
-- Measured costs: README, Performance ("Producer commits").
--
-- Replacing the trigger takes a SHARE ROW EXCLUSIVE lock on outbox for an instant, which
-- waits for open producer transactions and makes new ones wait behind it: lock_timeout
-- bounds that wait, so on a busy table the migration fails fast (run it again) instead of
-- stalling producers. The oid in WHEN is resolved here, once ('outbox' in this schema).
--
-- To keep the wake-up of 0001 (a NOTIFY from every insert statement, whatever the relays
-- do) at its cost to producer throughput, run after this migration:
--   DROP TRIGGER outbox_notify_insert ON outbox;
--   CREATE TRIGGER outbox_notify_insert AFTER INSERT ON outbox
--       FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
SET LOCAL lock_timeout = '3s';

DROP TRIGGER outbox_notify_insert ON outbox;

CREATE TRIGGER outbox_notify_insert
    AFTER INSERT ON outbox
    FOR EACH STATEMENT
    WHEN (NOT pg_try_advisory_xact_lock_shared(1868724343, 'outbox'::regclass::oid::int))
    EXECUTE FUNCTION outbox_notify();
