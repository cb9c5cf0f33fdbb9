// Command consumer is a QStash consumer of your own, in a module of your own: a Lambda
// behind a Function URL (or a plain net/http server) built on pkg/webhook and pkg/funcurl,
// with no edit of the outbox-relay repository. Copy this directory into your service, drop
// the replace line from go.mod, and register your topics in handlers.
//
// Environment: DATABASE_URL, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY
// (required); PUBLIC_BASE_URL (the base URL the relay publishes to; in Lambda, empty means
// the Function URL's own origin; over net/http it is required); LISTEN_ADDR (serve over
// net/http on this address instead of Lambda).
//
// Its tables: processed_messages (`outboxctl migrate up` on this database) and schema.sql.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/funcurl"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// handlers are the topics this consumer applies.
var handlers = webhook.Handlers{"order.created": shipOrder}

// shipOrder records a shipment for a created order, in the delivery's transaction: the
// shipment commits with the dedupe record or not at all.
func shipOrder(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
	var o struct {
		OrderID string `json:"order_id"`
	}
	if err := json.Unmarshal(d.Payload, &o); err != nil || o.OrderID == "" {
		// Never retried; the text is the dead letter's reason, so no secrets in it.
		return webhook.Permanent(errors.New("order.created needs an order_id"))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id, outbox_id) VALUES ($1, $2)`, o.OrderID, d.MessageID); err != nil {
		return fmt.Errorf("insert shipment: %w", err) // retried by QStash
	}
	return nil
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	if err := run(context.Background(), log); err != nil {
		log.Error("consumer stopped", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	// One request at a time per Lambda instance: two connections are plenty.
	pc, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("open database pool: %w", err)
	}
	defer pool.Close()
	verifier, err := qstash.NewVerifier(qstash.VerifierConfig{
		CurrentSigningKey: os.Getenv("QSTASH_CURRENT_SIGNING_KEY"),
		NextSigningKey:    os.Getenv("QSTASH_NEXT_SIGNING_KEY"),
	})
	if err != nil {
		return fmt.Errorf("make signature verifier: %w", err)
	}
	listen := os.Getenv("LISTEN_ADDR") // set: net/http; empty: Lambda
	h, err := webhook.New(webhook.Config{
		Pool:          pool,
		Verifier:      verifier,
		Handlers:      handlers,
		PublicBaseURL: os.Getenv("PUBLIC_BASE_URL"),
		// A Function URL cannot be given to its own function: without PUBLIC_BASE_URL, the
		// signed URL's origin is the one the Lambda event names. Over net/http there is no
		// such event, and New then refuses an empty PublicBaseURL.
		OriginFromFunctionURL: listen == "",
		Logger:                log,
	})
	if err != nil {
		return fmt.Errorf("make webhook handler: %w", err)
	}
	// Lambda (lambda.Start, which does not return) unless LISTEN_ADDR is set.
	return funcurl.Serve(h, listen, funcurl.Config{Logger: log})
}
