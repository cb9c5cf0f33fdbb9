package lambdasvc_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdasvc"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// deployed is the relay Lambda as the template wires it, behind the local Invoke API: its
// reserved concurrency, timeout and event age, the database, the local QStash and a
// consumer. Its sessions carry application name app.
type deployed struct {
	db      *pgtest.DB
	qs      *qstashtest.Server
	cons    *qstashtest.Destination
	svc     *lambdasvc.Service
	kicker  *kick.Kicker
	app     string
	results *results
}

func deploy(t *testing.T) *deployed {
	t.Helper()
	return deployWith(t, nil)
}

// deployWith is deploy with the function's configuration changed by tune.
func deployWith(t *testing.T, tune func(*lambdasvc.FunctionConfig)) *deployed {
	t.Helper()
	d := &deployed{db: pgtest.New(t), qs: qstashtest.NewTestServer(t, qstashtest.Options{}), cons: &qstashtest.Destination{}, results: &results{}}
	dest := httptest.NewServer(d.cons)
	t.Cleanup(dest.Close)
	d.app = "relay-" + d.db.Schema
	env := map[string]string{
		"DATABASE_URL": d.db.URL + "&application_name=" + d.app, "QSTASH_URL": d.qs.URL, "QSTASH_TOKEN": d.qs.Token,
		"PUBLIC_BASE_URL": dest.URL, "LOG_LEVEL": "warn",
	}
	fc := lambdasvc.FunctionConfig{
		Name: "relay", Bootstrap: bootstrap(t, "./functions/relay"), Timeout: 50 * time.Second, ReservedConcurrency: 2,
		Env:      env,
		OnResult: d.results.add,
	}
	if tune != nil {
		tune(&fc)
	}
	svc, err := lambdasvc.Start(fc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	d.svc = svc
	// The producer's kicker, pointed at the local service as AWS_ENDPOINT_URL_LAMBDA would.
	d.kicker, err = kick.New(t.Context(), kick.Config{Function: "arn:aws:lambda:eu-west-1:123456789012:function:relay", DB: d.db.Pool, Client: client(svc.URL, 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.kicker.Close(context.Background()) })
	return d
}

// commit enqueues one event in a transaction of its own; kicker nil commits without a kick.
func (d *deployed) commit(t *testing.T, w outbox.Waker) outbox.ID {
	t.Helper()
	var id outbox.ID
	err := outbox.BeginFunc(t.Context(), d.db.Pool, w, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(t.Context(), tx, outbox.Event{Topic: "order.created", PartitionKey: "order:1", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// dispatched waits until event id is dispatched and returns commit -> dispatched (both on
// the database's clock).
func (d *deployed) dispatched(t *testing.T, id outbox.ID, within time.Duration) time.Duration {
	t.Helper()
	var lat time.Duration
	testwait.Eventually(t, within, func() bool {
		var ms *float64
		if err := d.db.Pool.QueryRow(t.Context(), `SELECT extract(epoch FROM dispatched_at - created_at) * 1000 FROM outbox WHERE id = $1`, id).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		if ms != nil {
			lat = time.Duration(*ms * float64(time.Millisecond))
		}
		return ms != nil
	}, "event %d dispatched", id)
	return lat
}

// sessions counts the relay's database sessions.
func (d *deployed) sessions(t *testing.T) int {
	t.Helper()
	return d.db.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, d.app)
}

// TestKickedRelayUnderTheLocalLambdaService: the deployed shape. A producer commits and
// kicks; the built relay, under aws-lambda-rie behind the local Invoke API with the
// template's reserved concurrency, drains through the local QStash to a consumer well
// within a second of the commit, events committed while it drains go out with it, and
// between bursts the relay holds no database session. Then a commit whose kick is lost
// is delivered by the scheduled tick.
func TestKickedRelayUnderTheLocalLambdaService(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	var lat []time.Duration
	// Bursts apart by more than the idle gap: each needs a kick and a new invocation (the
	// first is a cold start, reported apart); inside a burst, commits 100 ms apart ride on
	// the invocation the burst's first kick woke.
	var cold time.Duration
	for burst := range 4 {
		for i := range 3 {
			id := d.commit(t, d.kicker)
			l := d.dispatched(t, id, 20*time.Second)
			if burst == 0 && i == 0 {
				cold = l
			} else {
				lat = append(lat, l)
			}
			time.Sleep(100 * time.Millisecond) // the producers' pace: what is measured
		}
		// The invocation returns a second after the burst's last event and closes its
		// sessions.
		testwait.Eventually(t, 20*time.Second, func() bool { return d.sessions(t) == 0 }, "burst %d: the relay's sessions closed", burst)
		time.Sleep(500 * time.Millisecond) // idle past the kick interval: the next burst kicks
	}
	slices.Sort(lat)
	p50, worst := lat[len(lat)/2], lat[len(lat)-1]
	t.Logf("commit -> dispatched, warm, kicked: p50 %v, max %v over %d events; cold start %v; service %+v; kicker %+v",
		p50, worst, len(lat), cold, d.svc.Stats("relay"), d.kicker.Stats())
	if worst > time.Second {
		t.Errorf("a kicked event took %v from commit to dispatched, want under a second (all: %v)", worst, lat)
	}
	if ks := d.kicker.Stats(); ks.Sent < 4 || ks.Sent > 8 || ks.Failed != 0 {
		t.Errorf("kicker %+v: want one kick per burst or two", ks)
	}

	// A lost kick: the event is committed, nobody kicks; the scheduled tick delivers it.
	sent := d.kicker.Stats().Sent
	stop, err := d.svc.Schedule("relay", 3*time.Second, []byte(`{"task":"drain"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	id := d.commit(t, nil)
	l := d.dispatched(t, id, 20*time.Second)
	if l > 5*time.Second || d.kicker.Stats().Sent != sent {
		t.Fatalf("lost kick: dispatched after %v (the tick is every 3 s), kicks %+v", l, d.kicker.Stats())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := d.qs.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(d.cons.Counts()); n != 13 {
		t.Fatalf("the consumer saw %d distinct events, want 13", n)
	}
	t.Logf("lost kick delivered by the tick after %v; invocations %+v", l, count(d.results.get()))
}

// tally is what the relay's invocations did: claimed events, opened sessions to find
// nothing, or were answered without a session (coalesced kicks); failed counts those
// that failed or answered something else.
type tally struct{ drained, empty, coalesced, failed int }

func count(all []lambdasvc.Result) tally {
	var n tally
	for _, r := range all {
		var res struct {
			Claimed   int  `json:"claimed"`
			Coalesced bool `json:"coalesced"`
		}
		switch {
		case r.Err != nil || json.Unmarshal(r.Body, &res) != nil:
			n.failed++
		case res.Coalesced:
			n.coalesced++
		case res.Claimed == 0:
			n.empty++
		default:
			n.drained++
		}
	}
	return n
}

// TestThrottledKicksCoalesce: four producers whose kickers read no promises (an older
// library, Config.DB unset) kick a relay whose reserved concurrency is 1 while it drains.
// The kicks beyond it are throttled and retried by the service, as by Lambda; those that
// reach the environment after it claimed their commits are answered without a database
// session. Nothing is lost, and no kick costs a session to find nothing.
func TestThrottledKicksCoalesce(t *testing.T) {
	t.Parallel()
	d := deployWith(t, func(c *lambdasvc.FunctionConfig) { c.ReservedConcurrency, c.RetryBase = 1, 200*time.Millisecond })
	kickers := make([]*kick.Kicker, 4)
	for i := range kickers {
		kickers[i] = newKickerOn(t, d, nil)
	}
	ids := produce(t, d, kickers, 20, 4*time.Second)
	waitDispatched(t, d, len(ids))
	st, n := settled(t, d)
	t.Logf("%d events; service %+v; invocations %+v", len(ids), st, n)
	if st.Retried == 0 || st.Environments != 1 || n.coalesced == 0 || n.drained == 0 || n.failed != 0 {
		t.Fatalf("want throttled kicks retried into one environment and coalesced there: service %+v, invocations %+v", st, n)
	}
	if n.empty > 1 {
		t.Fatalf("%d invocations opened sessions to find nothing", n.empty)
	}
}

// TestPromisesSpareKicks: the same four producers with kickers that read the relay's
// promises (Config.DB), at 20 commits/s for 4 s, under the template's reserved
// concurrency: the first kick wakes the relay, which promises while it drains, and the
// producers send no further invoke. Nothing is lost, and nearly every invocation claims
// events.
func TestPromisesSpareKicks(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	kickers := make([]*kick.Kicker, 4)
	for i := range kickers {
		kickers[i] = newKicker(t, d)
	}
	ids := produce(t, d, kickers, 20, 4*time.Second)
	waitDispatched(t, d, len(ids))
	st, n := settled(t, d)
	var promised int64
	for _, k := range kickers {
		promised += k.Stats().Promised
	}
	t.Logf("%d events; service %+v; invocations %+v; %d kicker reads found a promise", len(ids), st, n, promised)
	if n.failed != 0 || n.drained == 0 || st.Accepted > 3 || n.empty+n.coalesced > 1 || promised == 0 {
		t.Fatalf("want one or two invocations that drain and no kick sent while the relay promises: service %+v, invocations %+v, %d promised", st, n, promised)
	}
}

// settled waits until every kick accepted has run, been answered, or aged out, and
// returns the service's counts and the invocations' tally.
func settled(t *testing.T, d *deployed) (lambdasvc.Stats, tally) {
	t.Helper()
	testwait.Eventually(t, 90*time.Second, func() bool {
		s := d.svc.Stats("relay")
		return s.Accepted == s.Async+s.Dropped
	}, "the queued kicks settled")
	return d.svc.Stats("relay"), count(d.results.get())
}
