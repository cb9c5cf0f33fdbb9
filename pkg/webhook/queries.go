package webhook

// qInsertCharge is the example order.created side effect: one charge per order. ON CONFLICT
// keeps a second event for the same order (a different outbox id) from charging twice.
const qInsertCharge = `
INSERT INTO billing_charges (order_id, amount_cents, currency, outbox_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (order_id) DO NOTHING`

// qLegacyIdentity accepts a legacy delivery's claimed outbox id ($1) while the legacy window
// is open and the row has the delivered topic ($2) and payload ($3, compared as the text
// the relay publishes: payload::text).
const qLegacyIdentity = `
SELECT EXISTS (
    SELECT 1
    FROM legacy_identity l
    JOIN outbox o ON o.id = $1::bigint
    WHERE now() < l.accept_until AND o.topic = $2::text AND o.payload::text = $3::text)`
