package chaos_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/internal/relayconfig"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/pkg/qstash"
)

// Fuzz targets for the entry points that had none: the signature verifier, Enqueue's
// validation and the relay's environment parsing. (The failure-callback decoder, the
// recorder and the webhook request path have theirs: FuzzDecodeFailureCallback in
// pkg/qstash, FuzzFailureCallback in pkg/deadletter, FuzzWebhookRequest in pkg/webhook.)
// `make fuzz` runs every one for FUZZTIME.

const fuzzURL = "https://hooks.example.com/events/order.created"

// FuzzVerify: Verify never panics and fails only with a *VerifyError; a token Sign made
// verifies for its own URL and body and for no other.
func FuzzVerify(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"order_id":"o-1","amount_cents":1,"currency":"EUR"}`)
	tok, err := qstash.Sign(qstash.DevCurrentSigningKey, fuzzURL, body, now)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tok, fuzzURL, body, []byte(`{}`))
	f.Add("", fuzzURL, body, body)
	f.Add("a.b.c", "", []byte(nil), []byte("x"))
	f.Add(tok+"x", fuzzURL+"/", body, []byte(`{"order_id":"o-2"}`))
	f.Add(strings.Replace(tok, ".", "..", 1), fuzzURL, body, []byte(" "))
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey,
		Now: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, sig, url string, body, other []byte) {
		if err := v.Verify(sig, url, body); err != nil {
			var ve *qstash.VerifyError
			if !errors.As(err, &ve) || !errors.Is(err, qstash.ErrBadSignature) {
				t.Fatalf("Verify error %v is not a *VerifyError wrapping ErrBadSignature", err)
			}
		}
		if url == "" || !utf8.ValidString(url) {
			return // a URL is ASCII; JSON would replace invalid bytes in the sub claim
		}
		good, err := qstash.Sign(qstash.DevCurrentSigningKey, url, body, now)
		if err != nil {
			return // Sign refuses some URLs; nothing to check
		}
		if err := v.Verify(good, url, body); err != nil {
			t.Fatalf("a token signed for %q does not verify: %v", url, err)
		}
		if string(other) != string(body) && v.Verify(good, url, other) == nil {
			t.Fatalf("a token for body %q verifies body %q", body, other)
		}
		if sig != url && v.Verify(good, sig, body) == nil {
			t.Fatalf("a token for URL %q verifies URL %q", url, sig)
		}
	})
}

// FuzzLimitsValidate: an event Validate accepts is one Postgres stores (inside a
// transaction that stays usable); an event it rejects gets a *ValidationError naming a
// field, before any statement runs.
func FuzzLimitsValidate(f *testing.F) {
	f.Add("order.created", "order:1", []byte(`{"order_id":"o-1"}`), "X-Correlation-Id", "c-1")
	f.Add("a/b", "k", []byte(`{}`), "", "")
	f.Add("..", "k", []byte(`[]`), "X-A", "v")
	f.Add("a%2Fb", "k\x00", []byte(`"x"`), "Upstash-Retries", "1")
	f.Add("t", strings.Repeat("k", 300), []byte(`{"a":"\u0000"}`), "X-A", "v\r\n")
	f.Add("t", "k", []byte(strings.Repeat("[", 70)+strings.Repeat("]", 70)), "bad name", "v")
	f.Add("t", "k", []byte("\"\xff\""), "X-A", "\xff")
	f.Add("t", "k", []byte(`{"n":1e308,"s":"\u00e9\ud83d\ude00"}`), "X-A", "v")
	db := pgtest.New(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, topic, key string, payload []byte, hname, hvalue string) {
		ev := outbox.Event{Topic: topic, PartitionKey: key, Payload: payload}
		if hname != "" {
			ev.Headers = map[string]string{hname: hvalue}
		}
		verr := outbox.Limits{}.Validate(ev)
		if verr != nil {
			var ve *outbox.ValidationError
			if !errors.As(verr, &ve) || ve.Field == "" || ve.Reason == "" {
				t.Fatalf("Validate error %v is not a *ValidationError with a field and reason", verr)
			}
			return
		}
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := outbox.Enqueue(ctx, tx, ev); err != nil {
			t.Fatalf("Validate accepted %+v but Postgres refused it: %v", ev, err)
		}
	})
}

// FuzzRelayConfig: whatever the environment, FromEnv does not panic; a configuration it
// accepts builds a Publisher and satisfies the relay's own Validate; an error never
// echoes the database password.
func FuzzRelayConfig(f *testing.F) {
	f.Add("postgres://app:pw-secret@db:5432/app", "30s", "10s", "100", "12", "30s", "1h", "3", "fifo", "8", "14d")
	f.Add("postgres://app:pw-secret@db:notaport/app", "1s", "10s", "0", "-1", "0s", "1ms", "x", "lifo", "0", "1s")
	f.Add("", "", "", "", "", "", "", "", "", "", "")
	f.Add("host=db password=pw-secret", "7d", "1ns", "10001", "1", "1s", "1s", "100", "publish", "1000", "2d")
	f.Fuzz(func(t *testing.T, dbURL, lease, publishTimeout, batch, attempts, base, maxB, retries, ordering, queues, dedupe string) {
		env := map[string]string{
			"DATABASE_URL": dbURL, "QSTASH_TOKEN": "tok", "PUBLIC_BASE_URL": "https://hooks.example.com",
			"LEASE": lease, "PUBLISH_TIMEOUT": publishTimeout, "BATCH_SIZE": batch, "MAX_ATTEMPTS": attempts,
			"BACKOFF_BASE": base, "BACKOFF_MAX": maxB, "QSTASH_RETRIES": retries, "ORDERING": ordering,
			"FIFO_QUEUES": queues, "DEDUPE_TTL": dedupe,
		}
		cfg, err := relayconfig.FromEnv(func(k string) string { return env[k] })
		if err != nil {
			if i := strings.Index(dbURL, "pw-secret"); i >= 0 && strings.Contains(err.Error(), "pw-secret") {
				t.Fatalf("config error echoes the database password: %v", err)
			}
			return
		}
		if err := cfg.Relay.WithDefaults().Validate(); err != nil {
			t.Fatalf("FromEnv accepted a relay config that relay rejects: %v", err)
		}
		if _, err := qstash.NewPublisher(cfg.Publisher); err != nil {
			t.Fatalf("FromEnv accepted a publisher config that NewPublisher rejects: %v", err)
		}
	})
}
