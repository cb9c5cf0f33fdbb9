package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/console"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// start serves a console for cfg (DB filled in from db) on an httptest server.
func start(t testing.TB, db *pgtest.DB, cfg console.Config) *httptest.Server {
	t.Helper()
	_, ts := serve(t, db, cfg)
	return ts
}

// serve is start for the tests that also look inside the console (its chart cache).
func serve(t testing.TB, db *pgtest.DB, cfg console.Config) (*console.Server, *httptest.Server) {
	t.Helper()
	cfg.DB = db.Pool
	srv, err := console.New(cfg)
	if err != nil {
		t.Fatalf("console.New: %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return srv, ts
}

// get fetches path and returns status and body.
func get(t testing.TB, c *http.Client, base, path string) (int, string) {
	t.Helper()
	resp, err := c.Get(base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t testing.TB, c *http.Client, base, path string, form url.Values, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

var csrfRE = regexp.MustCompile(`<meta name="csrf-token" content="([^"]+)">`)

// session is a new browser (an HTTP client with a cookie jar that does not follow
// redirects) that has loaded path, so it holds the CSRF cookie, and the page's token: what
// every action needs.
func session(t testing.TB, base, path string) (*http.Client, string) {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	code, body := get(t, c, base, path)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("GET %s (%d): no csrf token in page", path, code)
	}
	return c, m[1]
}

func mustContain(t testing.TB, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Fatalf("page lacks %q:\n%s", w, clip(body))
		}
	}
}

func mustNotContain(t testing.TB, body string, unwanted ...string) {
	t.Helper()
	for _, w := range unwanted {
		if strings.Contains(body, w) {
			t.Fatalf("page has %q:\n%s", w, clip(body))
		}
	}
}

func clip(s string) string {
	if len(s) > 4000 {
		return s[:4000] + "…"
	}
	return s
}

// event returns n events of topic and key with a JSON payload carrying their index.
func events(topic, key string, n int, headers map[string]string) []outbox.Event {
	evs := make([]outbox.Event, n)
	for i := range evs {
		p, _ := json.Marshal(map[string]any{"n": i, "topic": topic})
		evs[i] = outbox.Event{Topic: topic, PartitionKey: key, Payload: p, Headers: headers}
	}
	return evs
}

// enqueue writes evs with the producer API and returns their ids.
func enqueue(t testing.TB, db *pgtest.DB, evs []outbox.Event) []outbox.ID {
	t.Helper()
	ids, err := outbox.EnqueueBatch(context.Background(), db.Pool, evs)
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return ids
}

// settle claims every ready row as the relay does and dead-letters (dead=true) or
// dispatches it, at the database clock or at the time given.
func settle(t testing.TB, db *pgtest.DB, dead bool, errMsg string, at *time.Time) int {
	t.Helper()
	ctx := context.Background()
	store := outboxstore.NewStore(db.Pool)
	total := 0
	for {
		lease, err := outboxstore.NewLease()
		if err != nil {
			t.Fatal(err)
		}
		claimed, err := store.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 500, KeyRun: 1, For: time.Minute, Now: at})
		msgs := claimed.Messages
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		if len(msgs) == 0 {
			return total
		}
		if dead {
			fails := make([]outboxstore.Failure, len(msgs))
			for i, m := range msgs {
				fails[i] = outboxstore.Failure{ID: m.ID, Error: fmt.Sprintf("%s (event %d)", errMsg, m.ID), StatusCode: 400}
			}
			if _, err := store.DeadLetter(ctx, lease, fails, at); err != nil {
				t.Fatalf("dead-letter: %v", err)
			}
		} else {
			ids := make([]outbox.ID, len(msgs))
			for i, m := range msgs {
				ids[i] = m.ID
			}
			if _, err := store.MarkDispatched(ctx, lease, ids, at); err != nil {
				t.Fatalf("mark dispatched: %v", err)
			}
		}
		total += len(msgs)
	}
}

// letterIDs returns the dead letter ids of the given outbox ids, in outbox id order.
func letterIDsOf(t testing.TB, db *pgtest.DB, ids []outbox.ID) []int64 {
	t.Helper()
	raw := make([]int64, len(ids))
	for i, id := range ids {
		raw[i] = int64(id)
	}
	rows, err := db.Pool.Query(context.Background(), `SELECT id FROM dead_letters WHERE outbox_id = ANY($1) ORDER BY outbox_id`, raw)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(ids) {
		t.Fatalf("%d dead letters for %d outbox rows", len(out), len(ids))
	}
	return out
}

// rowState is what a redrive changes on an outbox row and its letters.
type rowState struct {
	Pending      bool
	Generation   int
	Attempts     int
	OpenLetters  int
	RedrivenOnes int
}

func stateOf(t testing.TB, db *pgtest.DB, id outbox.ID) rowState {
	t.Helper()
	var s rowState
	err := db.Pool.QueryRow(context.Background(), `
SELECT o.dispatched_at IS NULL AND o.dead_lettered_at IS NULL, o.generation, o.attempts,
       (SELECT count(*) FROM dead_letters d WHERE d.outbox_id = o.id AND d.resolved_at IS NULL),
       (SELECT count(*) FROM dead_letters d WHERE d.outbox_id = o.id AND d.resolution = 'redriven')
FROM outbox o WHERE o.id = $1`, int64(id)).Scan(&s.Pending, &s.Generation, &s.Attempts, &s.OpenLetters, &s.RedrivenOnes)
	if err != nil {
		t.Fatalf("state of %d: %v", id, err)
	}
	return s
}
