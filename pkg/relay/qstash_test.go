package relay_test

// The relay against the strict local QStash server over real HTTP: the deferrals the
// publisher derives from production's answers (a used-up quota, a wrong QSTASH_URL, an
// outage) spend no attempt, dead-letter nothing and pause the drain.

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// localQStash starts the local QStash server with opts, and a destination that accepts
// every delivery, and returns the server and a publisher to it.
func localQStash(t *testing.T, opts qstashtest.Options) (*qstashtest.Server, *qstash.Publisher) {
	t.Helper()
	srv := qstashtest.NewTestServer(t, opts)
	sink := httptest.NewServer(&qstashtest.Destination{})
	t.Cleanup(sink.Close)
	return srv, qstashPublisher(t, srv.URL, srv.Token, sink.URL)
}

func qstashPublisher(t *testing.T, baseURL, token, dest string) *qstash.Publisher {
	t.Helper()
	p, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: baseURL, Token: token, DestinationBaseURL: dest})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The daily quota runs out mid-drain and resets a second later: every event ends
// dispatched with exactly one attempt (the 429s cost none), nothing is dead-lettered, and
// the drain itself waits for the reset and resumes.
func TestLocalQStashQuotaResumesAfterReset(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 100, outboxtest.Mod(9))
	_, pub := localQStash(t, qstashtest.Options{QuotaMessages: 40, QuotaWindow: time.Second})
	st := drainFor(t, newRelay(t, db, pub, relay.Config{BatchSize: 30, Ordering: publish.OrderingPublish, Logger: quiet()}), time.Minute)
	if st.Dispatched != 100 || st.DeferredQuota == 0 || st.DeadLettered != 0 {
		t.Fatalf("stats %+v: want every event dispatched across quota windows", st)
	}
	assertAttempts(t, db, 1, "(a 429 spends none)")
	assertNoDeadLetters(t, db)
}

// The quota resets long after the drain's deadline: the drain stops early, the rows it
// could not publish are pending with no attempt spent, nothing is dead-lettered.
func TestLocalQStashQuotaPastDeadline(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 100, outboxtest.Mod(100))
	_, pub := localQStash(t, qstashtest.Options{QuotaMessages: 20, QuotaWindow: time.Hour})
	start := time.Now()
	st := drainFor(t, newRelay(t, db, pub, relay.Config{BatchSize: 20, Ordering: publish.OrderingPublish, Logger: quiet()}), time.Minute)
	if st.PausedUntil.Before(start.Add(50*time.Minute)) || st.Dispatched != 20 || st.DeadLettered != 0 || st.DeferredQuota == 0 {
		t.Fatalf("stats %+v: want 20 dispatched, the rest deferred to the reset", st)
	}
	if time.Since(start) > 20*time.Second {
		t.Fatalf("the drain took %v: it waited instead of stopping", time.Since(start))
	}
	if s := states(t, db); s.pending != 80 || s.leased != 0 || s.deadLettered != 0 {
		t.Fatalf("states %+v", s)
	}
	for id, n := range attempts(t, db) {
		if n > 1 {
			t.Fatalf("row %d: %d attempts", id, n)
		}
	}
}

// A QSTASH_URL ending in /v2 (every path answered 404 by the server): nothing is
// dead-lettered, every row stays pending with no attempt spent, and the relay's log line
// names QSTASH_URL.
func TestLocalQStashWrongURL(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 50, outboxtest.Mod(5))
	srv, _ := localQStash(t, qstashtest.Options{Plan: qstash.PlanPayg})
	pub := qstashPublisher(t, qstashtest.V2Gateway(t, srv), srv.Token, "https://hooks.example.com")
	logger, logs := logtest.New()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	r := newRelay(t, db, pub, relay.Config{BatchSize: 50, DeferPause: time.Hour, Logger: logger})
	for range 3 {
		st := drain(ctx, t, r)
		if st.Dispatched+st.DeadLettered+st.Retried != 0 || st.PausedUntil.IsZero() {
			t.Fatalf("stats %+v", st)
		}
	}
	if s := states(t, db); s.pending != 50 || s.leased != 0 || s.deadLettered != 0 {
		t.Fatalf("states %+v", s)
	}
	assertAttempts(t, db, 0, "after a deployment fault")
	lines := deferLines(logs)
	if len(lines) != 1 || !strings.Contains(lines[0], "QSTASH_URL") || !strings.Contains(lines[0], `"reason":"deployment"`) {
		t.Fatalf("log lines %q: want one naming QSTASH_URL (the later drains claim nothing while paused)", lines)
	}
	if reqs := srv.Requests(); len(reqs) != 1 {
		t.Fatalf("%d requests reached the server, want 1: the relay kept publishing while paused", len(reqs))
	}
}

// An outage of QStash (every request 503, hanging past the publish timeout, or reset)
// spanning several drains, with a retry budget of 2: no attempt is spent, nothing is
// dead-lettered, each drain reports the outage, and once it ends one drain publishes
// everything with a single attempt per event. Before, each drain charged every claimed
// event an attempt and the second dead-lettered them all.
func TestOutageAcrossDrainsSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	for _, o := range []qstashtest.Outage{qstashtest.Outage503, qstashtest.OutageHang, qstashtest.OutageReset} {
		t.Run(string(o), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			seed(t, db, 120, outboxtest.Mod(11))
			srv, pub := localQStash(t, qstashtest.Options{Plan: qstash.PlanPayg, Faults: qstashtest.Faults{Outage: o}})
			cfg := relay.Config{BatchSize: 50, MaxAttempts: 2, PublishTimeout: 300 * time.Millisecond, MarkTimeout: time.Second,
				DeferPause: 20 * time.Millisecond, Ordering: publish.OrderingPublish, Logger: quiet()}
			for i := range 3 { // each a cold start, as Lambda invocations may be
				st := drainFor(t, newRelay(t, db, pub, cfg), 2*time.Second)
				if st.DeferredOutage == 0 || st.Dispatched+st.Retried+st.DeadLettered != 0 || st.DeferredDeployment+st.DeferredQuota != 0 {
					t.Fatalf("drain %d: stats %+v: want only outage deferrals", i, st)
				}
				assertAttempts(t, db, 0, fmt.Sprintf("during the outage (drain %d)", i))
			}
			assertNoDeadLetters(t, db)
			srv.SetFaults(qstashtest.Faults{})
			st := drainFor(t, newRelay(t, db, pub, cfg), time.Minute)
			if s := states(t, db); st.Dispatched != 120 || s.dispatched != 120 || s.deadLettered != 0 {
				t.Fatalf("after the outage: stats %+v, states %+v", st, s)
			}
			assertAttempts(t, db, 1, "after the outage")
		})
	}
}
