-- +goose Up
-- retried is Upstash-Retried of the delivery that processed the message (0 on QStash's first
-- attempt), so outboxctl status can say how many attempts QStash made (and billed) per
-- delivered event. NULL: unknown (recorded before this migration, or by a consumer that
-- does not say). Adding a nullable column without a default does not rewrite the table.
ALTER TABLE processed_messages ADD COLUMN retried integer;
