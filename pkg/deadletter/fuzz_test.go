package deadletter_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// FuzzFailureCallback drives the recorder's request path with arbitrary bodies, signed or
// not. Invariants: only the documented statuses; never 500 while the database is up;
// unsigned or undecodable callbacks write nothing; a decodable one writes at most one
// letter, and replaying it writes nothing more.
func FuzzFailureCallback(f *testing.F) {
	f.Add(callbackBody(1, "msg-seed"), true)
	f.Add(callbackBody(1, "msg-seed"), false)
	f.Add([]byte(`{"sourceMessageId":"m","sourceHeader":{"X-Outbox-Id":"5"},"sourceBody":"e30=","createdAt":"1725323658779"}`), true)
	f.Add([]byte(`{"sourceMessageId":"m2","sourceHeader":{"x-outbox-id":["5"]},"body":"","notBefore":0}`), true)
	f.Add([]byte(`{"sourceMessageId":"","status":500}`), true)
	f.Add([]byte(`null`), true)
	f.Add([]byte(`[]`), true)

	db := pgtest.New(f)
	h := newCallbackHandler(f, db, nil)
	ctx := context.Background()
	letters := func(t *testing.T) int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	f.Fuzz(func(t *testing.T, body []byte, signed bool) {
		r := signedCallback(t, failureURL, body)
		if !signed {
			r.Header.Del("Upstash-Signature")
		}
		before := letters(t)
		w := serveCallback(h, r)
		after := letters(t)
		_, decodeErr := qstash.DecodeFailureCallback(body)

		switch {
		case !signed:
			if w.Code != http.StatusUnauthorized || after != before {
				t.Fatalf("unsigned: status %d, letters %d -> %d", w.Code, before, after)
			}
		case len(body) > 4<<20:
			if w.Code != receive.StatusNonRetryable || w.Header().Get(receive.HeaderNonRetryable) != "true" || after != before {
				t.Fatalf("oversized: status %d, header %v, letters %d -> %d", w.Code, w.Header(), before, after)
			}
		case decodeErr != nil:
			if w.Code != http.StatusBadRequest || after != before {
				t.Fatalf("undecodable (%v): status %d, letters %d -> %d", decodeErr, w.Code, before, after)
			}
		default:
			if (w.Code != http.StatusOK && w.Code != http.StatusBadRequest) || after-before > 1 {
				t.Fatalf("decodable: status %d %s, letters %d -> %d", w.Code, w.Body, before, after)
			}
			if w.Code == http.StatusBadRequest && after != before {
				t.Fatal("400 wrote a letter")
			}
			// Replaying the same callback records nothing new.
			if w2 := serveCallback(h, signedCallback(t, failureURL, body)); w2.Code != w.Code || letters(t) != after {
				t.Fatalf("replay: status %d (first %d), letters %d -> %d", w2.Code, w.Code, after, letters(t))
			}
		}
	})
}
