package samtemplate_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdatest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// TestRIERelayIsolatesTheEventThatKillsIt runs the relay bootstrap as built under
// aws-lambda-rie and SIGKILLs it whenever it publishes one event (as Lambda kills a
// function over its memory, or at its timeout): the process dies holding its batch, and
// the emulator starts a fresh one at the next invoke. Before, every process claimed the
// dead batch again once its lease ended and died with it, and nothing more was
// dispatched. Now the rows of the dead batch come back one per claim, so only the event
// that kills dies again, alone, until after three deaths it is dead-lettered with that
// reason; the 39 others are delivered once each.
func TestRIERelayIsolatesTheEventThatKillsIt(t *testing.T) {
	t.Parallel()
	relayBin := binary(t, "./functions/relay")
	db := pgtest.New(t)
	ctx := ctxT(t, 3*time.Minute)
	outboxtest.Exec(t, db.Pool, `
INSERT INTO outbox (topic, partition_key, payload)
SELECT 'order.created', 'cust-' || (g % 8), CASE WHEN g = 6 THEN '{"n": 6, "note": "kills-the-relay"}' ELSE jsonb_build_object('n', g) END
FROM generate_series(1, 40) g`)
	var guilty int64
	if err := db.Pool.QueryRow(ctx, `SELECT id FROM outbox WHERE payload->>'note' = 'kills-the-relay'`).Scan(&guilty); err != nil {
		t.Fatal(err)
	}

	sink := newDeliverySink(t)
	var mu sync.Mutex
	qs := qstashtest.NewServer(qstashtest.Options{Plan: qstash.PlanPayg})
	defer qs.Close()
	bin := filepath.Join(t.TempDir(), "bootstrap")
	copyFile(t, relayBin, bin)

	// In front of QStash: a publish request carrying the event kills the relay's process
	// before QStash sees it.
	target, err := url.Parse(qs.URL)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	var kills []int // messages in each request that killed the relay
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if bytes.Contains(body, []byte("kills-the-relay")) {
			var batch []json.RawMessage
			if json.Unmarshal(body, &batch) != nil {
				batch = []json.RawMessage{body} // a single publish
			}
			mu.Lock()
			kills = append(kills, len(batch))
			mu.Unlock()
			if err := syscall.Kill(pidOf(t, bin), syscall.SIGKILL); err != nil {
				t.Error(err)
			}
			http.Error(w, "the relay is gone", http.StatusServiceUnavailable)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		forward.ServeHTTP(w, r)
	}))
	defer front.Close()

	relay := lambdatest.Start(t, lambdatest.Options{Bootstrap: bin, Name: "RelayFunction", Timeout: time.Minute, Env: map[string]string{
		"DATABASE_URL": db.URL, "QSTASH_URL": front.URL, "QSTASH_TOKEN": qs.Token, "QSTASH_PLAN": string(qstash.PlanPayg),
		"PUBLIC_BASE_URL": sink.URL + "/",
		// A short lease: each death costs one lease before the rows are claimed again.
		"LEASE": "10s", "PUBLISH_TIMEOUT": "2s",
	}})
	deaths := 0
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("after %d invokes and %d deaths: %d dispatched\n%s", i, deaths, db.Count(t, `SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL`), tail(relay.Log(), 4000))
		}
		resp := invoke(t, relay, readFile(t, "events/schedule.json"))
		if resp.Err() != nil {
			deaths++ // the emulator reports the runtime's exit; the next invoke starts a fresh one
			continue
		}
		var res relayResult
		if err := resp.Decode(&res); err != nil {
			t.Fatal(err)
		}
		if res.BacklogPending != nil && *res.BacklogPending == 0 {
			break
		}
		if res.Claimed == 0 {
			time.Sleep(time.Second) // the next tick: the dead process's lease has not ended yet
		}
	}
	var reason string
	if err := db.Pool.QueryRow(ctx, `SELECT error FROM dead_letters WHERE outbox_id = $1`, guilty).Scan(&reason); err != nil {
		t.Fatalf("the event that kills the relay has no dead letter: %v", err)
	}
	if !strings.Contains(reason, "the relay died 3 times while holding this row") {
		t.Errorf("dead letter's error %q", reason)
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL`); n != 39 {
		t.Errorf("%d events dispatched, want the 39 others", n)
	}
	if err := qs.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if deaths != 3 || len(kills) != 3 || kills[0] < 2 || kills[1] != 1 || kills[2] != 1 {
		t.Errorf("%d deaths, messages in each publish that killed the relay %v: want 3, the first with others, then alone", deaths, kills)
	}
	if slices.Contains(sink.check(t, 39), fmt.Sprint(guilty)) {
		t.Errorf("the event that kills the relay was delivered")
	}
}

// pidOf returns the process id of the one running process whose executable is exe.
func pidOf(t *testing.T, exe string) int {
	t.Helper()
	procs := procsOf(t, exe)
	if len(procs) != 1 {
		t.Fatalf("want one running %s, found %d", exe, len(procs))
	}
	pid, err := strconv.Atoi(filepath.Base(procs[0]))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
