-- The example consumer's side effect (examples/orders): one charge per order, committed
-- with the dedupe record. Replace it with your own tables.
CREATE TABLE IF NOT EXISTS billing_charges (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id      text        NOT NULL UNIQUE,
    amount_cents  bigint      NOT NULL CHECK (amount_cents > 0),
    currency      text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    outbox_id     text        NOT NULL,
    charged_at    timestamptz NOT NULL DEFAULT now()
);
