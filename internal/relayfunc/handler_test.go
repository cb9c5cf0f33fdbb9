package relayfunc

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

type stack struct {
	db      *pgtest.DB
	qs      *qstashtest.Server
	cons    *qstashtest.Destination
	env     map[string]string
	metrics *logtest.Buffer
}

func newStack(t *testing.T) *stack {
	t.Helper()
	db := pgtest.New(t)
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})
	cons := &qstashtest.Destination{}
	dest := httptest.NewServer(cons)
	t.Cleanup(dest.Close)
	return &stack{db: db, qs: qs, cons: cons, metrics: &logtest.Buffer{}, env: map[string]string{
		"DATABASE_URL": db.URL, "QSTASH_URL": qs.URL, "QSTASH_TOKEN": qs.Token, "PUBLIC_BASE_URL": dest.URL,
		"BATCH_SIZE": "50",
	}}
}

// handler is the invocation handler a cold start on s.env builds.
func (s *stack) handler(t *testing.T) *handler {
	t.Helper()
	return s.handlerOn(t, s.config(t), s.db.Pool, slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// config is s.env read as the cold start reads the environment.
func (s *stack) config(t *testing.T) Env {
	t.Helper()
	cfg, err := Load(t.Context(), mapEnv(s.env))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// handlerOn builds the invocation handler on cfg and pool, writing its metrics to s.metrics.
func (s *stack) handlerOn(t *testing.T, cfg Env, pool *pgxpool.Pool, logger *slog.Logger) *handler {
	t.Helper()
	h, err := newHandler(cfg, pool, nil, s.metrics, logger)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (s *stack) count(t *testing.T, where string) int {
	t.Helper()
	return s.db.Count(t, `SELECT count(*) FROM outbox WHERE `+where)
}

func invoke(t *testing.T, h *handler, timeout time.Duration, payload string) (result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	return h.handle(ctx, json.RawMessage(payload))
}

func TestDrainTask(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 230, outboxtest.Mod(7)))
	res, err := invoke(t, s.handler(t), 40*time.Second, `{"task":"drain"}`)
	if err != nil {
		t.Fatal(err)
	}
	if res.Task != "drain" || res.Drain.Claimed != 230 || res.Drain.Dispatched != 230 || res.Drain.Batches < 5 || res.BacklogPending == nil || *res.BacklogPending != 0 {
		t.Fatalf("result %+v", res)
	}
	if n := s.count(t, "dispatched_at IS NULL OR lease_token IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows not dispatched or still leased", n)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := s.qs.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if d := len(s.cons.Counts()); d != 230 {
		t.Fatalf("consumer saw %d distinct events, want 230", d)
	}
	lines := s.metrics.Lines()
	if len(lines) != 1 {
		t.Fatalf("want one EMF line per invocation, got %d", len(lines))
	}
	m := lines[0]
	if m["Function"] != "relay" || m["Dispatched"] != 230.0 || m["Claimed"] != 230.0 || m["BacklogPending"] != 0.0 || m["_aws"] == nil {
		t.Fatalf("EMF line %v", m)
	}
	if _, ok := m["PublishLatency"].([]any); !ok {
		t.Fatalf("EMF line lacks PublishLatency samples: %v", m)
	}
	b, _ := json.Marshal(res)
	if !strings.Contains(string(b), `"dispatched":230`) {
		t.Fatalf("response JSON %s", b)
	}
}

// TestResultJSON pins the invocation result scripts read: a drain's non-zero counts,
// named as in its log line, right after task; the retention task's batches; no counts at
// all for a task that did not drain.
func TestResultJSON(t *testing.T) {
	t.Parallel()
	pending := int64(4)
	complete := true
	for _, c := range []struct {
		res  result
		want string
	}{
		{result{Task: taskDrain, Drain: relay.Stats{Claimed: 3, Dispatched: 2, DeadLettered: 1, DeferredDeployment: 2, Batches: 1, PublishCalls: 1},
			StoppedAtDeadline: true, BacklogPending: &pending, DurationMS: 5},
			`{"task":"drain","claimed":3,"dispatched":2,"dead_lettered":1,"deferred_deployment":2,"batches":1,"publish_calls":1,"stopped_at_deadline":true,"backlog_pending":4,"duration_ms":5}`},
		{result{Task: taskDrain, BacklogPending: new(int64)}, `{"task":"drain","backlog_pending":0,"duration_ms":0}`},
		{result{Task: taskRetention, OutboxDeleted: 12, RetentionBatches: 2, Complete: &complete, DurationMS: 7},
			`{"task":"retention","batches":2,"outbox_deleted":12,"complete":true,"duration_ms":7}`},
	} {
		b, err := json.Marshal(c.res)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("result JSON\n got %s\nwant %s", b, c.want)
		}
	}
}

// TestPayloadShapes: what the schedule may send. An envelope without Input, an empty or
// null payload, and unknown fields mean drain; a non-object or an unknown task is refused.
func TestPayloadShapes(t *testing.T) {
	t.Parallel()
	envelope := `{"version":"0","id":"89d1a02d-5ec7-412e-82f5-13505f849b41","detail-type":"Scheduled Event","source":"aws.events",` +
		`"account":"123456789012","time":"2026-12-02T20:00:00Z","region":"eu-west-1","resources":["arn:aws:events:eu-west-1:123456789012:rule/tick"],"detail":{}}`
	scheduler := `{"version":"0","detail-type":"Scheduled Event","source":"aws.scheduler","detail":"{}"}`
	for _, c := range []struct {
		payload, task, err string
	}{
		{envelope, taskDrain, ""},
		{scheduler, taskDrain, ""},
		{``, taskDrain, ""},
		{`null`, taskDrain, ""},
		{`{}`, taskDrain, ""},
		{`{"task":"drain","scheduledTime":"2026-12-02T20:00:00Z"}`, taskDrain, ""},
		{`{"task":"retention"}`, taskRetention, ""},
		{`{"task":"dlq-sync"}`, taskDLQSync, ""},
		{`{"task":"kick","sent_at":"2026-12-07T01:02:03.5Z"}`, taskKick, ""},
		{`{"task":"kick","sent_at":"yesterday"}`, "", "decode relay payload"},
		{`{"task":"vacuum"}`, "", `unknown relay task "vacuum"`},
		{`"drain"`, "", "want a JSON object"},
		{`[1]`, "", "want a JSON object"},
		{`{"task":1}`, "", "decode relay payload"},
		{`{"task":`, "", "decode relay payload"},
	} {
		req, err := parseTask(json.RawMessage(c.payload))
		if c.err == "" && (err != nil || req.Task != c.task) {
			t.Errorf("%s: task %q err %v, want %q", c.payload, req.Task, err, c.task)
		}
		if c.task == taskKick && !req.SentAt.Equal(time.Date(2026, 12, 7, 1, 2, 3, 5e8, time.UTC)) {
			t.Errorf("%s: sent_at %v", c.payload, req.SentAt)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: err %v, want %q", c.payload, err, c.err)
		}
	}
}

func TestUnknownTaskChangesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 3, outboxtest.Mod(7)))
	_, err := invoke(t, s.handler(t), 10*time.Second, `{"task":"drian"}`)
	if err == nil || !strings.Contains(err.Error(), `unknown relay task "drian"`) {
		t.Fatalf("err = %v", err)
	}
	if n := s.count(t, "dispatched_at IS NULL AND attempts = 0 AND lease_token IS NULL"); n != 3 {
		t.Fatalf("an unknown task touched rows: %d untouched of 3", n)
	}
	if len(s.metrics.Lines()) != 0 {
		t.Fatal("an unknown task wrote metrics")
	}
}

func TestEnvelopeDrains(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 5, outboxtest.Mod(7)))
	res, err := invoke(t, s.handler(t), 30*time.Second, `{"version":"0","detail-type":"Scheduled Event","source":"aws.events","detail":{}}`)
	if err != nil || res.Drain.Dispatched != 5 {
		t.Fatalf("envelope: %+v %v", res, err)
	}
}

func TestRetentionTask(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := t.Context()
	if _, err := s.db.Pool.Exec(ctx, `INSERT INTO outbox (topic, partition_key, payload, dispatched_at)
		SELECT 't', 'k', '{}', now() - interval '8 days' FROM generate_series(1, 12)`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'webhook', g::text, now() - interval '15 days' FROM generate_series(1, 4) g`); err != nil {
		t.Fatal(err)
	}
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 2, outboxtest.Mod(7))) // pending: kept
	res, err := invoke(t, s.handler(t), 30*time.Second, `{"task":"retention"}`)
	if err != nil {
		t.Fatal(err)
	}
	if res.Task != "retention" || res.OutboxDeleted != 12 || res.ProcessedDeleted != 4 || res.Complete == nil || !*res.Complete {
		t.Fatalf("result %+v", res)
	}
	if n := s.count(t, "true"); n != 2 {
		t.Fatalf("%d outbox rows left, want the 2 pending", n)
	}
	lines := s.metrics.Lines()
	if len(lines) != 1 || lines[0]["RetentionDeletedOutbox"] != 12.0 || lines[0]["RetentionDeletedProcessed"] != 4.0 {
		t.Fatalf("EMF %v", lines)
	}
}

// TestDLQSyncTask: events whose deliveries failed with no failure callback configured exist
// only in QStash's DLQ until the dlq-sync task records them, once however often it runs.
func TestDLQSyncTask(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	// A permanent refusal: QStash puts the message in its DLQ at once, and dlq sync records
	// it (a transient one would go back to the outbox: pkg/deadletter TestSyncReschedulesOutage).
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Upstash-NonRetryable-Error", "true")
		w.WriteHeader(489)
	}))
	t.Cleanup(failing.Close)
	s.env["PUBLIC_BASE_URL"], s.env["QSTASH_RETRIES"] = failing.URL, "0"
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 3, outboxtest.Mod(7)))
	h := s.handler(t)
	if res, err := invoke(t, h, 30*time.Second, `{"task":"drain"}`); err != nil || res.Drain.Dispatched != 3 {
		t.Fatalf("drain: %+v %v", res, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := s.qs.WaitIdle(ctx); err != nil || len(s.qs.DLQ()) != 3 {
		t.Fatalf("QStash DLQ: %d entries, %v", len(s.qs.DLQ()), err)
	}

	res, err := invoke(t, h, 30*time.Second, readEvent(t, "dlq-sync.json"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Task != "dlq-sync" || res.DLQSync == nil || res.DLQSync.Recorded != 3 || res.DLQSync.Scanned != 3 {
		t.Fatalf("result %+v (%+v)", res, res.DLQSync)
	}
	if n := s.count(t, "dead_lettered_at IS NOT NULL"); n != 3 {
		t.Fatalf("%d rows dead-lettered, want 3", n)
	}
	lines := s.metrics.Lines()
	if last := lines[len(lines)-1]; last["DLQSyncRecorded"] != 3.0 {
		t.Fatalf("EMF %v", last)
	}
	res, err = invoke(t, h, 30*time.Second, `{"task":"dlq-sync"}`)
	if err != nil || res.DLQSync.Recorded != 0 || res.DLQSync.AlreadyRecorded != 3 {
		t.Fatalf("second sync: %+v %v", res.DLQSync, err)
	}
	if n := s.db.Count(t, `SELECT count(*) FROM dead_letters`); n != 3 {
		t.Fatalf("%d dead letters, want 3", n)
	}
}

// readEvent returns a sample event of events/, the one local invoke uses.
func readEvent(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../events/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDeadlineReserve: with less time than the reserve plus the relay's margin, nothing is
// claimed, yet the metrics line (with the backlog) is written and the response returned
// before the deadline.
func TestDeadlineReserve(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 4, outboxtest.Mod(7)))
	h := s.handler(t)
	start := time.Now()
	timeout := DeadlineReserve + 5*time.Second // below reserve + DeadlineMargin (15s)
	res, err := invoke(t, h, timeout, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > timeout {
		t.Fatalf("returned after the deadline (%v)", time.Since(start))
	}
	if res.Drain.Claimed != 0 || !res.StoppedAtDeadline || res.BacklogPending == nil || *res.BacklogPending != 4 {
		t.Fatalf("result %+v", res)
	}
	if n := s.count(t, "lease_token IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows left leased", n)
	}
	if l := s.metrics.Lines(); len(l) != 1 || l[0]["BacklogPending"] != 4.0 {
		t.Fatalf("EMF %v", l)
	}
}

// TestIdleGap: a kicked invocation on an empty outbox stays IDLE_GAP from its start and
// dispatches an event committed inside it, then returns a gap after it; a scheduled tick
// that finds the outbox empty returns at once.
func TestIdleGap(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.env["IDLE_GAP"] = "1s"
	h := s.handler(t)
	type out struct {
		res result
		err error
	}
	done := make(chan out, 1)
	start := time.Now()
	go func() {
		r, err := invoke(t, h, 40*time.Second, `{"task":"kick"}`)
		done <- out{r, err}
	}()
	time.Sleep(500 * time.Millisecond) // inside the gap: what is tested
	committed := time.Now()
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 5, outboxtest.Mod(7)))
	o := <-done
	if o.err != nil || o.res.Task != taskKick || o.res.Drain.Dispatched != 5 {
		t.Fatalf("kick: %+v %v", o.res, o.err)
	}
	if el, want := time.Since(start), committed.Sub(start)+time.Second; el < want || el > want+5*time.Second {
		t.Fatalf("kick returned after %v, want about %v", el, want)
	}
	start = time.Now()
	res, err := invoke(t, h, 40*time.Second, `{"task":"drain"}`)
	if err != nil || res.Drain.Claimed != 0 || time.Since(start) >= time.Second {
		t.Fatalf("empty tick: %+v %v after %v, want at once", res, err, time.Since(start))
	}
}

// sessions counts the server's backends of application name app, other than the
// caller's.
func (s *stack) sessions(t *testing.T, app string) int {
	t.Helper()
	return s.db.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app)
}

// relayPool opens the pool an invocation handler runs on, its sessions named app.
func (s *stack) relayPool(t *testing.T, app string) *pgxpool.Pool {
	t.Helper()
	return pgtest.OpenPool(t, s.db.URL, func(c *pgxpool.Config) {
		c.MaxConns = 12
		c.ConnConfig.RuntimeParams["application_name"] = app
	})
}

// TestInvocationClosesEverySession: after each task, drains that waited on LISTEN and
// published batches on several connections included, the relay holds no session: an idle
// stack lets Aurora Serverless v2 pause. The next invocation reconnects.
func TestInvocationClosesEverySession(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.env["IDLE_GAP"] = "300ms"
	s.env["BATCH_SIZE"] = "10"
	app := "relay-" + s.db.Schema
	pool := s.relayPool(t, app)
	h := s.handlerOn(t, s.config(t), pool, slog.New(slog.DiscardHandler))
	for i, payload := range []string{`{"task":"drain"}`, `{"task":"kick"}`, `{"task":"retention"}`, `{"task":"drain"}`} {
		outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(i*100, 100, outboxtest.Mod(7)))
		res, err := invoke(t, h, 40*time.Second, payload)
		if err != nil {
			t.Fatalf("%s: %v", payload, err)
		}
		if payload != `{"task":"retention"}` && res.Drain.Dispatched == 0 {
			t.Fatalf("%s: %+v, want events dispatched", payload, res)
		}
		if n := pool.Stat().TotalConns(); n != 0 {
			t.Fatalf("%s: the pool keeps %d sessions after the invocation", payload, n)
		}
		// The server ends a backend just after its client's Terminate.
		testwait.Eventually(t, 5*time.Second, func() bool { return s.sessions(t, app) == 0 }, "%s: no backend of %s left", payload, app)
	}
	if n := s.count(t, "dispatched_at IS NULL"); n != 0 {
		t.Fatalf("%d events not dispatched", n)
	}
}

// TestKickCoalesced: a kick sent before an earlier invocation of the same environment last
// found the outbox idle is answered without a database session; a later one drains.
func TestKickCoalesced(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.env["IDLE_GAP"] = "200ms"
	pool := s.relayPool(t, "relay-"+s.db.Schema)
	h := s.handlerOn(t, s.config(t), pool, slog.New(slog.DiscardHandler))
	kick := func(sentAt time.Time) result {
		t.Helper()
		res, err := invoke(t, h, 40*time.Second, fmt.Sprintf(`{"task":"kick","sent_at":%q}`, sentAt.Format(time.RFC3339Nano)))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 3, outboxtest.Mod(7)))
	first := time.Now()
	if res := kick(first); res.Coalesced || res.Drain.Dispatched != 3 {
		t.Fatalf("first kick: %+v", res)
	}
	conns := pool.Stat().NewConnsCount()
	if res := kick(first); !res.Coalesced || res.Drain.Claimed != 0 {
		t.Fatalf("kick sent before the first one's end: %+v, want coalesced", res)
	}
	if n := pool.Stat().NewConnsCount(); n != conns {
		t.Fatalf("a coalesced kick opened %d sessions", n-conns)
	}
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(3, 2, outboxtest.Mod(7)))
	if res := kick(time.Now()); res.Coalesced || res.Drain.Dispatched != 2 {
		t.Fatalf("kick after the first one's end: %+v, want a drain", res)
	}
}

// TestDatabaseDown: the invocation fails with the cause, and still writes its counters.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	pool, err := pgxpool.New(t.Context(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h := s.handlerOn(t, s.config(t), pool, slog.New(slog.DiscardHandler))
	_, err = invoke(t, h, 30*time.Second, `{"task":"drain"}`)
	if err == nil || !strings.Contains(err.Error(), "drain outbox") {
		t.Fatalf("err = %v", err)
	}
	// The counters are written although no claim succeeded (Batches counts claims that
	// leased rows).
	if l := s.metrics.Lines(); len(l) != 1 || l[0]["Batches"] != 0.0 || l[0]["Claimed"] != 0.0 {
		t.Fatalf("EMF %v", l)
	}
}

func TestLoadConfigReportsEveryBadVariable(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"BATCH_SIZE": "0", "LEASE": "x", "PUBLISH_TIMEOUT": "y", "MAX_ATTEMPTS": "-1", "BACKOFF_BASE": "z",
		"BACKOFF_MAX": "w", "IDLE_GAP": "v", "OUTBOX_RETENTION": "u", "DEDUPE_TTL": "1m", "QSTASH_RETRIES": "x",
		"ORDERING": "random", "FIFO_QUEUES": "-3", "FLOW_CONTROL_PARALLELISM": "p", "FLOW_CONTROL_RATE": "r",
		"FLOW_CONTROL_PERIOD": "q", "LOG_LEVEL": "chatty", "QSTASH_URL": "nope", "PUBLIC_BASE_URL": "nope",
		"FAILURE_CALLBACK_URL": "nope",
	}
	_, err := Load(t.Context(), func(k string) string { return bad[k] })
	if err == nil {
		t.Fatal("accepted")
	}
	for _, name := range append([]string{"DATABASE_URL", "QSTASH_TOKEN"}, keys(bad)...) {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s:\n%v", name, err)
		}
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestFIFOQueuesCheckedAtColdStart: in fifo ordering the first drain creates the queues
// with parallelism 1; a cold start that finds one paused refuses to drain, names the
// queue, and claims nothing.
func TestFIFOQueuesCheckedAtColdStart(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	s.env["ORDERING"], s.env["FIFO_QUEUES"], s.env["OUTBOX_NAME"] = "fifo", "3", "shop"
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 20, outboxtest.Mod(7)))
	if _, err := invoke(t, s.handler(t), 40*time.Second, `{"task":"drain"}`); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, s.qs.URL+"/v2/queues/shop-1/pause", nil)
	req.Header.Set("Authorization", "Bearer "+s.qs.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("pause: %v %v", resp, err)
	}
	resp.Body.Close()
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 10, outboxtest.Mod(7)))
	res, err := invoke(t, s.handler(t), 40*time.Second, `{"task":"drain"}`)
	if err == nil || !strings.Contains(err.Error(), "shop-1 is paused") || res.Drain.Claimed != 0 {
		t.Fatalf("drain with a paused queue: %+v %v", res, err)
	}
	if n := s.count(t, "dispatched_at IS NULL AND attempts = 0"); n != 10 {
		t.Fatalf("%d untouched rows, want the 10 new ones", n)
	}
}

// TestCheckTimeout: a function timeout that leaves less than the drain margin after the
// reserve is refused at cold start, naming both numbers; enough, or unknown, passes.
func TestCheckTimeout(t *testing.T) {
	t.Parallel()
	margin := 15 * time.Second
	err := checkTimeout(mapEnv(map[string]string{"FUNCTION_TIMEOUT": "10"}), margin)
	if err == nil || !strings.Contains(err.Error(), "10s") || !strings.Contains(err.Error(), "15s") || !strings.Contains(err.Error(), "at least 17s") {
		t.Fatalf("10 s timeout against a 15 s margin: %v; want refused naming 10s, 15s and 17s", err)
	}
	if err := checkTimeout(mapEnv(map[string]string{"AWS_LAMBDA_FUNCTION_TIMEOUT": "16"}), margin); err == nil {
		t.Fatal("16 s from the emulator's variable accepted: 14 s left is under the 15 s margin")
	}
	for name, m := range map[string]map[string]string{
		"exactly enough": {"FUNCTION_TIMEOUT": "17"},
		"default":        {"FUNCTION_TIMEOUT": "50"},
		"ours wins":      {"FUNCTION_TIMEOUT": "50", "AWS_LAMBDA_FUNCTION_TIMEOUT": "3"},
		"unknown":        {},
	} {
		if err := checkTimeout(mapEnv(m), margin); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := checkTimeout(mapEnv(map[string]string{"FUNCTION_TIMEOUT": "soon"}), margin); err == nil {
		t.Fatal("a timeout that is not a number accepted")
	}
}

func mapEnv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// The QStash token is rotated at its source (QSTASH_TOKEN_PARAM) while the environment is
// warm: the drain re-reads it once, publishes everything, and the dlq-sync task's DLQ
// client uses the token that was re-read, with no second read.
func TestRotatedTokenRereadOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	outboxtest.Enqueue(t, s.db.Pool, outboxtest.Orders(0, 120, outboxtest.Mod(7)))
	cfg := s.config(t)
	var reads atomic.Int32
	cfg.Publisher.Tokens = qstash.NewToken(cfg.Publisher.Token, func(context.Context) (string, error) {
		reads.Add(1)
		return "rotated", nil
	})
	h := s.handlerOn(t, cfg, s.db.Pool, slog.New(slog.DiscardHandler))
	s.qs.SetToken("rotated")
	res, err := invoke(t, h, 30*time.Second, `{"task":"drain"}`)
	if err != nil || res.Drain.Dispatched != 120 || res.Drain.DeferredDeployment != 0 {
		t.Fatalf("drain after the rotation: %+v %v", res, err)
	}
	if res, err := invoke(t, h, 30*time.Second, `{"task":"dlq-sync"}`); err != nil || res.DLQSync == nil {
		t.Fatalf("dlq-sync after the rotation: %+v %v", res, err)
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("%d re-reads, want 1 shared by the publisher and the DLQ client", n)
	}
}
