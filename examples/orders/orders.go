// Package orders is the example consumer: the order.created handler the local stack, the
// tests and a fresh deployment run, and the table it writes (billing_charges, created by
// Migrate; the outbox's own migrations do not create it). Replace it with your own
// handlers, registered in functions/webhook/main.go:
//
//	webhook.Handlers{"order.created": orders.OrderCreated, "invoice.paid": myapp.InvoicePaid}
//
// A handler writes only through the transaction it is given, so its side effects commit
// together with the dedupe record; it returns webhook.Permanent(err) for input a retry
// cannot fix.
package orders

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// ErrInvalidPayload is wrapped by every validation error of Parse.
var ErrInvalidPayload = errors.New("invalid payload")

// MaxOrderIDBytes bounds order_id.
const MaxOrderIDBytes = 128

// Payload is the order.created event body.
type Payload struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// Parse decodes and validates an order.created payload: a JSON object with
// order_id (non-empty string, at most MaxOrderIDBytes, no control characters),
// amount_cents (an integer literal > 0; 1.0 and 1e3 are rejected) and currency (three
// upper-case ASCII letters, e.g. EUR). Unknown fields are ignored, so producers can add
// fields before consumers know them (tolerant reader); a field with the wrong type is an
// error. Errors wrap ErrInvalidPayload and name the field.
func Parse(b []byte) (Payload, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		return Payload{}, fmt.Errorf("%w: order.created must be a JSON object", ErrInvalidPayload)
	}
	var p Payload
	fail := func(field, reason string) (Payload, error) {
		return Payload{}, fmt.Errorf("%w: %s %s", ErrInvalidPayload, field, reason)
	}

	if err := stringField(raw, "order_id", &p.OrderID); err != nil {
		return fail("order_id", err.Error())
	}
	switch {
	case p.OrderID == "":
		return fail("order_id", "is empty")
	case len(p.OrderID) > MaxOrderIDBytes:
		return fail("order_id", fmt.Sprintf("is %d bytes, the limit is %d", len(p.OrderID), MaxOrderIDBytes))
	case !utf8.ValidString(p.OrderID) || containsControl(p.OrderID):
		return fail("order_id", "contains invalid or control characters")
	}

	amount, ok := raw["amount_cents"]
	if !ok {
		return fail("amount_cents", "is missing")
	}
	var n json.Number
	// json.Number also accepts a quoted number; only a bare literal is a number.
	if err := json.Unmarshal(amount, &n); err != nil || len(amount) == 0 || amount[0] == '"' {
		return fail("amount_cents", "must be a number")
	}
	v, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		return fail("amount_cents", "must be an integer number of cents")
	}
	if v <= 0 {
		return fail("amount_cents", "must be greater than 0")
	}
	p.AmountCents = v

	if err := stringField(raw, "currency", &p.Currency); err != nil {
		return fail("currency", err.Error())
	}
	if !isCurrency(p.Currency) {
		return fail("currency", "must be three upper-case letters (ISO 4217), e.g. EUR")
	}
	return p, nil
}

// OrderCreated is the example handler of the order.created topic: it charges the order once
// by inserting one billing_charges row, in the delivery's transaction. A second event for
// an order already charged is a no-op. Invalid payloads are permanent errors (489, dead
// letter). Replace it with your own handlers; see the comment at the top of this file.
func OrderCreated(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
	p, err := Parse(d.Payload)
	if err != nil {
		return webhook.Permanent(err)
	}
	if _, err := tx.Exec(ctx, qInsertCharge, p.OrderID, p.AmountCents, p.Currency, d.MessageID); err != nil {
		// A data or constraint error is deterministic: retrying the same row fails again.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23") {
			return webhook.Permanent(fmt.Errorf("insert billing charge: %w", err))
		}
		return fmt.Errorf("insert billing charge: %w", err)
	}
	return nil
}

func stringField(raw map[string]json.RawMessage, name string, dst *string) error {
	v, ok := raw[name]
	if !ok {
		return errors.New("is missing")
	}
	if err := json.Unmarshal(v, dst); err != nil || string(v) == "null" {
		return errors.New("must be a string")
	}
	return nil
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

func containsControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

// Topic is the topic OrderCreated handles.
const Topic = "order.created"

// Handlers registers the example: order.created -> OrderCreated.
func Handlers() webhook.Handlers { return webhook.Handlers{Topic: OrderCreated} }

//go:embed schema.sql
var schema string

// qInsertCharge is the example side effect: one charge per order. ON CONFLICT keeps a
// second event for the same order (a different outbox id) from charging twice.
const qInsertCharge = `
INSERT INTO billing_charges (order_id, amount_cents, currency, outbox_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (order_id) DO NOTHING`

// Migrate creates the example's table if it is missing (idempotent; safe on a database
// whose outbox migrations created it before the example moved here).
func Migrate(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}) error {
	if _, err := db.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create example tables: %w", err)
	}
	return nil
}
