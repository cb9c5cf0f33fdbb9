-- The example consumer's own table (examples/consumer): one shipment per order, written in
-- the transaction that records the delivery in processed_messages. Yours are your own.
CREATE TABLE IF NOT EXISTS shipments (
    order_id   text        PRIMARY KEY,
    outbox_id  text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
