-- +goose Up
-- Demo side-effect table of the example order.created handler (functions/webhook).
-- Replace it with your own tables; it shows a side effect committed with the dedupe row.
CREATE TABLE billing_charges (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id      text        NOT NULL UNIQUE,
    amount_cents  bigint      NOT NULL CHECK (amount_cents > 0),
    currency      text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    outbox_id     text        NOT NULL,
    charged_at    timestamptz NOT NULL DEFAULT now()
);
