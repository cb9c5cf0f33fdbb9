-- +goose Up
-- The relay now puts the message identity in the destination URL (…/events/<topic>?
-- outbox_id=<id>&generation=<n>), which QStash's signature covers; it used to forward it
-- only as an unsigned X-Outbox-Id header. Deliveries published before the upgrade are still
-- being retried by QStash for its retry horizon (with the default 3 retries about 1.5 hours;
-- each retry past the fifth adds up to a day), so the receivers accept them while
-- now() < accept_until:
--   webhook            only when X-Outbox-Id names an outbox row with the delivery's topic
--                      and exactly its payload, so a replay under another id can only
--                      deliver that other event's own content, once (its dedupe record
--                      makes the real delivery a duplicate);
--   failure callback   takes the id from the callback's reported source headers (inside
--                      its signed body).
-- After accept_until both refuse such deliveries (the webhook with 401, the callback records
-- the letter unlinked from the outbox). A database that holds no outbox row yet has no
-- deliveries in flight: its window is closed from the start.
--
-- Move the date: UPDATE legacy_identity SET accept_until = now() + interval '2 days';
-- Close it now:  UPDATE legacy_identity SET accept_until = now();
-- README ("Message identity") says when the fallback code and this table can go.
CREATE TABLE legacy_identity (
    one          boolean     PRIMARY KEY DEFAULT true CHECK (one),
    accept_until timestamptz NOT NULL
);

INSERT INTO legacy_identity (accept_until)
SELECT CASE WHEN EXISTS (SELECT 1 FROM outbox) THEN now() + interval '7 days' ELSE now() END;
