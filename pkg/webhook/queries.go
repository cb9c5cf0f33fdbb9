package webhook

// qInsertCharge is the example order.created side effect: one charge per order. ON CONFLICT
// keeps a second event for the same order (a different outbox id) from charging twice.
const qInsertCharge = `
INSERT INTO billing_charges (order_id, amount_cents, currency, outbox_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (order_id) DO NOTHING`
