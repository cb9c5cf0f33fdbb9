package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/examples/orders"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/pkg/webhook"
)

// A consumer registers one HandlerFunc per topic. The handler writes only through tx, so
// its writes commit with the dedupe record, and marks input a retry cannot fix as
// Permanent (489: QStash stops retrying, the failure callback records a dead letter).
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	verifier, err := qstash.NewVerifier(qstash.VerifierConfig{
		CurrentSigningKey: os.Getenv("QSTASH_CURRENT_SIGNING_KEY"),
		NextSigningKey:    os.Getenv("QSTASH_NEXT_SIGNING_KEY"),
	})
	if err != nil {
		log.Fatal(err)
	}
	invoicePaid := func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		var p struct {
			InvoiceID string `json:"invoice_id"`
		}
		if err := json.Unmarshal(d.Payload, &p); err != nil || p.InvoiceID == "" {
			return webhook.Permanent(errors.New("invoice.paid needs an invoice_id"))
		}
		_, err := tx.Exec(ctx, `UPDATE invoices SET paid = true WHERE id = $1`, p.InvoiceID)
		return err // unmarked: transient, QStash retries
	}
	h, err := webhook.New(webhook.Config{
		Pool:     pool,
		Verifier: verifier,
		Handlers: webhook.Handlers{
			"order.created": orders.OrderCreated,
			"invoice.paid":  invoicePaid,
		},
		PublicBaseURL: os.Getenv("PUBLIC_BASE_URL"), // what the relay publishes to
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe(":8080", h))
}
