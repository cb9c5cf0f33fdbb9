package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// A consumer registers one HandlerFunc per topic. The handler writes only through tx, so
// its writes commit with the dedupe record, and marks input a retry cannot fix as
// Permanent (489: QStash stops retrying, the failure callback records a dead letter).
// The Handler is a plain http.Handler: functions/webhook serves it in Lambda through
// pkg/funcurl, and http.ListenAndServe serves it anywhere else.
func ExampleNew() {
	ctx := context.Background()
	db := pgtest.MustOpen(ctx, // in production: the application's pool
		`CREATE TABLE invoices (id text PRIMARY KEY, paid boolean NOT NULL)`,
		`INSERT INTO invoices VALUES ('inv-1', false)`)
	defer db.Close()

	verifier, err := qstash.NewVerifier(qstash.VerifierConfig{
		CurrentSigningKey: qstash.DevCurrentSigningKey, // QSTASH_CURRENT_SIGNING_KEY
		NextSigningKey:    qstash.DevNextSigningKey,    // QSTASH_NEXT_SIGNING_KEY
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
	const public = "https://hooks.example.com" // PUBLIC_BASE_URL: what the relay publishes to
	h, err := webhook.New(webhook.Config{
		Pool:          db.Pool,
		Verifier:      verifier,
		Handlers:      webhook.Handlers{"invoice.paid": invoicePaid},
		PublicBaseURL: public,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	// deliver posts body as QStash would deliver outbox event id, signed with key.
	deliver := func(id int, body, key string) {
		path := fmt.Sprintf("/events/invoice.paid?outbox_id=%d&generation=0", id)
		sig, err := qstash.Sign(key, public+path, []byte(body), time.Now())
		if err != nil {
			log.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, bytes.NewBufferString(body))
		req.Header.Set("Upstash-Signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(id, resp.StatusCode)
	}
	deliver(1, `{"invoice_id":"inv-1"}`, qstash.DevCurrentSigningKey) // applied
	deliver(1, `{"invoice_id":"inv-1"}`, qstash.DevCurrentSigningKey) // a redelivery: acknowledged, not applied again
	deliver(2, `{}`, qstash.DevCurrentSigningKey)                     // permanent: 489
	deliver(3, `{"invoice_id":"inv-1"}`, "forged-key")                // not signed by QStash: 401

	var paid bool
	if err := db.Pool.QueryRow(ctx, `SELECT paid FROM invoices WHERE id = 'inv-1'`).Scan(&paid); err != nil {
		log.Fatal(err)
	}
	fmt.Println("inv-1 paid:", paid)
	// Output:
	// 1 200
	// 1 200
	// 2 489
	// 3 401
	// inv-1 paid: true
}
