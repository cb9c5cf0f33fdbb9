package deadletter_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// TestFailureCallbackHostile: a delivery's signature replayed to the failure endpoint is
// refused (the subject differs), as are an expired callback and an unsigned alg-none token;
// nothing is written. (Malformed bodies, bad base64, oversize, forgeries:
// TestCallbackRejectsBadInputWithoutWriting and TestCallbackRecordsOnceAndRejectsForgeries;
// the decoder: pkg/qstash FuzzDecodeFailureCallback.)
func TestFailureCallbackHostile(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	h := newCallbackHandler(t, db, nil)
	body := callbackBody(1, "msg_1")
	now := time.Now()
	noneToken := func() string {
		claims := jwt.MapClaims{"iss": "Upstash", "sub": failureURL, "iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(),
			"body": qstash.BodyHash(body)}
		s, err := jwt.NewWithClaims(jwt.SigningMethodNone, claims).SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sign := func(url string, at time.Time) string {
		s, err := qstash.Sign(qstash.DevCurrentSigningKey, url, body, at)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for name, sig := range map[string]string{
		"signed for the webhook URL": sign("https://hooks.example.com/events/order.created?outbox_id=1&generation=0", now),
		"expired":                    sign(failureURL, now.Add(-10*time.Minute)),
		"alg none":                   noneToken(),
	} {
		r := signedCallback(t, failureURL, body)
		r.Header.Set("Upstash-Signature", sig)
		if w := serveCallback(h, r); w.Code != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, w.Code)
		}
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != 0 {
		t.Fatalf("hostile callbacks wrote %d letters", n)
	}
}
