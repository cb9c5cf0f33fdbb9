-- +goose Up
-- This version once created billing_charges, the example consumer's table. The example now
-- lives in examples/orders, which creates its own table (orders.Migrate, applied by the
-- local stack and `outboxctl migrate up --example`); a database migrated before keeps the
-- table and its data. The version stays so the numbering of deployed databases holds.
SELECT 1;
