package qstash_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

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
