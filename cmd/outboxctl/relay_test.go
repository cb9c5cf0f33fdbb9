package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/relayfunc"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

type relayInstance struct {
	stderr *logtest.Buffer
	done   chan int
	addr   string
}

var startedAddr = regexp.MustCompile(`"msg":"relay started".*?"addr":"([^"]+)"`)

func startRelay(t *testing.T, ctx context.Context, vars map[string]string) *relayInstance {
	t.Helper()
	inst := &relayInstance{stderr: &logtest.Buffer{}, done: make(chan int, 1)}
	e := env{stdout: io.Discard, stderr: inst.stderr, getenv: func(k string) string { return vars[k] }}
	go func() {
		inst.done <- run(ctx, e, []string{"relay", "--listen", "127.0.0.1:0", "--retention-interval", "0", "--gauge-interval", "50ms", "--batch", "40"})
	}()
	testwait.Eventually(t, 15*time.Second, func() bool {
		m := startedAddr.FindStringSubmatch(inst.stderr.String())
		if m != nil {
			inst.addr = m[1]
		}
		return m != nil
	}, "relay start")
	return inst
}

// scrape returns the value of an unlabeled sample in the instance's /metrics.
func scrape(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return -1
}

func countRows(t *testing.T, db *pgtest.DB, where string) int {
	t.Helper()
	return db.Count(t, `SELECT count(*) FROM outbox WHERE `+where)
}

// TestRelayTwoInstances runs two relay processes on one table: every event is claimed once
// and delivered once, the counters of both add up, and a stop in the middle of a load
// leaves nothing leased and nothing half-done.
func TestRelayTwoInstances(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})
	got := &qstashtest.Destination{}
	dest := httptest.NewServer(got)
	defer dest.Close()
	vars := map[string]string{"DATABASE_URL": db.URL, "QSTASH_URL": qs.URL, "QSTASH_TOKEN": qs.Token, "PUBLIC_BASE_URL": dest.URL}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := startRelay(t, ctx, vars), startRelay(t, ctx, vars)

	// Many small transactions, each a notification both relays wake on: a relay whose claim
	// finds only rows the other holds goes back to waiting, and with a few large ones a
	// pipelining relay can take the whole load before the other claims anything.
	const n, chunk = 1500, 50
	for c := range n / chunk {
		outboxtest.Enqueue(t, db.Pool, outboxtest.Orders(c*chunk, chunk, outboxtest.Mod(500)))
		time.Sleep(10 * time.Millisecond)
	}
	testwait.Eventually(t, 60*time.Second, func() bool { return countRows(t, db, "dispatched_at IS NOT NULL") == n }, "all events dispatched")
	if bad := countRows(t, db, "attempts <> 1 OR lease_token IS NOT NULL OR dead_lettered_at IS NOT NULL"); bad != 0 {
		t.Fatalf("%d rows claimed more than once, still leased or dead-lettered", bad)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := qs.WaitIdle(wctx); err != nil {
		t.Fatal(err)
	}
	seen := got.Counts()
	if len(seen) != n {
		t.Fatalf("consumer saw %d distinct events, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("event %s delivered %d times", id, c)
		}
	}
	// Counters reach /metrics at the end of each chunk.
	testwait.Eventually(t, 3*relayChunk, func() bool {
		return scrape(t, a.addr, "outbox_dispatched_total")+scrape(t, b.addr, "outbox_dispatched_total") == n
	}, "dispatched counters to add up")
	// With 500 keys and batches of 40 both instances find claimable heads; with fewer keys
	// than a batch, one relay holds every key's head and the other finds nothing ready.
	da, dbn := scrape(t, a.addr, "outbox_dispatched_total"), scrape(t, b.addr, "outbox_dispatched_total")
	t.Logf("dispatched by instance: %v and %v", da, dbn)
	if da == 0 || dbn == 0 {
		t.Fatalf("one instance did all the work (%v, %v): the test did not exercise two relays", da, dbn)
	}
	testwait.Eventually(t, 5*time.Second, func() bool { return scrape(t, a.addr, "outbox_backlog_pending") == 0 }, "backlog gauge")
	for _, inst := range []*relayInstance{a, b} {
		resp, err := http.Get("http://" + inst.addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "ok\n" {
			t.Fatalf("healthz %d %q", resp.StatusCode, body)
		}
	}

	// Stop both in the middle of a second load.
	outboxtest.Enqueue(t, db.Pool, outboxtest.Orders(0, 1000, outboxtest.Mod(500)))
	testwait.Eventually(t, 30*time.Second, func() bool { return countRows(t, db, "dispatched_at IS NOT NULL") > n }, "the second load to start")
	cancel()
	for _, inst := range []*relayInstance{a, b} {
		select {
		case code := <-inst.done:
			if code != 0 {
				t.Fatalf("relay exited %d:\n%s", code, inst.stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("relay did not stop")
		}
	}
	if leased := countRows(t, db, "lease_token IS NOT NULL"); leased != 0 {
		t.Fatalf("%d rows left leased after a clean stop", leased)
	}
	// Every row is either dispatched (claimed once) or untouched: the batch in flight at the
	// stop was published and marked, nothing was retried or released half-done.
	if bad := countRows(t, db, "NOT ((dispatched_at IS NOT NULL AND attempts = 1) OR (dispatched_at IS NULL AND attempts = 0))"); bad != 0 {
		t.Fatalf("%d rows in a half-done state", bad)
	}
	if err := qs.WaitIdle(wctx); err != nil {
		t.Fatal(err)
	}
	dispatched := countRows(t, db, "dispatched_at IS NOT NULL")
	seen = got.Counts()
	if len(seen) != dispatched {
		t.Fatalf("consumer saw %d events, %d dispatched", len(seen), dispatched)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("event %s delivered %d times", id, c)
		}
	}
	for _, inst := range []*relayInstance{a, b} {
		if !strings.Contains(inst.stderr.String(), `"msg":"relay stopped"`) {
			t.Fatalf("no clean stop logged:\n%s", inst.stderr.String())
		}
	}
}

func TestRelayFlags(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x", "QSTASH_TOKEN": "t", "PUBLIC_BASE_URL": "https://h.example.com"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:9090"}, "must be a loopback address"},
		{[]string{"--listen", "nohost"}, "--listen"},
		{[]string{"--batch", "0"}, "BATCH_SIZE"},
		{[]string{"--lease", "1s"}, "LEASE"},
		{[]string{"--gauge-interval", "0s"}, "must be positive"},
	} {
		var stderr logtest.Buffer
		e := env{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string { return vars[k] }}
		if code := run(context.Background(), e, append([]string{"relay"}, c.args...)); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: code %d stderr %q, want %q", c.args, code, stderr.String(), c.want)
		}
	}
	var stderr logtest.Buffer
	e := env{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }}
	if code := run(context.Background(), e, []string{"relay"}); code != 2 || !strings.Contains(stderr.String(), "DATABASE_URL: is not set") {
		t.Errorf("no environment: %d %s", code, stderr.String())
	}
}

func TestCheckLoopback(t *testing.T) {
	t.Parallel()
	for addr, ok := range map[string]bool{
		"127.0.0.1:9090": true, "[::1]:9090": true, "localhost:0": true, "127.0.0.2:80": true,
		"0.0.0.0:9090": false, ":9090": false, "10.0.0.1:9090": false, "example.com:80": false, "127.0.0.1:http": false,
	} {
		if err := checkLoopback(addr); (err == nil) != ok {
			t.Errorf("checkLoopback(%q) = %v", addr, err)
		}
	}
}

// TestRelayRefusesAPausedFIFOQueue: outboxctl relay in fifo ordering checks the queues
// before it starts: a paused one stops it with an error naming the queue.
func TestRelayRefusesAPausedFIFOQueue(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})
	for _, path := range []string{"/v2/queues/", "/v2/queues/shop-1/pause"} {
		body := ""
		if path == "/v2/queues/" {
			body = `{"queueName":"shop-1","parallelism":1}`
		}
		req, _ := http.NewRequest(http.MethodPost, qs.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+qs.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	vars := map[string]string{"DATABASE_URL": db.URL, "QSTASH_URL": qs.URL, "QSTASH_TOKEN": qs.Token, "PUBLIC_BASE_URL": "http://127.0.0.1:1",
		"ORDERING": "fifo", "FIFO_QUEUES": "2", "OUTBOX_NAME": "shop"}
	stderr := &logtest.Buffer{}
	e := env{stdout: io.Discard, stderr: stderr, getenv: func(k string) string { return vars[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if code := run(ctx, e, []string{"relay", "--listen", "127.0.0.1:0"}); code == 0 || !strings.Contains(stderr.String(), "shop-1 is paused") {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
}

// gatedPublisher accepts every message; its calls wait (up to 5 s) until gate of them are
// in flight at once, so that many batches reach their marks together.
func gatedPublisher(gate int) relay.PublisherFunc {
	var mu sync.Mutex
	inFlight := 0
	open := make(chan struct{})
	return func(ctx context.Context, msgs []outbox.Message) []publish.Result {
		mu.Lock()
		inFlight++
		if inFlight == gate {
			close(open)
		}
		mu.Unlock()
		select {
		case <-open:
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
		return make([]publish.Result, len(msgs))
	}
}

// TestRelayPoolCountsWhatRuns: outboxctl relay's pool has a connection for the claim, one
// per batch in flight, the LISTEN session, the gauge and the retention loop. With the
// LISTEN session, the gauge and retention each holding one, a drain with every batch in
// flight marking at once never waits for a connection.
func TestRelayPoolCountsWhatRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const concurrency = 4
	var cfg relayfunc.Env
	cfg.DatabaseURL, cfg.Relay.PublishConcurrency = db.URL, concurrency
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	for retention, want := range map[bool]int32{true: 1 + concurrency + 3, false: 1 + concurrency + 2} {
		if got := relayConns(cfg.Relay, retention); got != want {
			t.Errorf("pool size with retention %v: %d, want %d", retention, got, want)
		}
	}
	if got := relayConns(relay.Config{}, true); got != 1+relay.DefaultPublishConcurrency+3 {
		t.Errorf("pool size with the default concurrency: %d", got)
	}
	pool, err := openRelayPool(ctx, cfg, true, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	outboxtest.Enqueue(t, db.Pool, outboxtest.Orders(0, 400, outboxtest.Mod(400)))

	// Every connection open and idle, then the three long-lived users take theirs.
	max := int(pool.Config().MaxConns)
	conns := make([]*pgxpool.Conn, max)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns[3:] {
		c.Release()
	}
	defer func() {
		for _, c := range conns[:3] {
			c.Release()
		}
	}()
	waited := pool.Stat().EmptyAcquireCount()

	r, err := relay.New(pool, gatedPublisher(concurrency),
		relay.Config{BatchSize: 20, PublishConcurrency: concurrency, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.Drain(ctx)
	if err != nil || st.Dispatched != 400 {
		t.Fatalf("drain: %v, stats %+v", err, st)
	}
	if n := pool.Stat().EmptyAcquireCount() - waited; n != 0 {
		t.Fatalf("the drain waited %d times for a connection (pool of %d, 3 held by the LISTEN session, the gauge and retention)", n, max)
	}
}

// TestRelayStopsWithinItsGrace: SIGTERM while a claim is stuck behind a lock on the outbox
// table. The claim gives up at its timeout (LEASE - PUBLISH_TIMEOUT - the 5 s mark
// timeout: 1 s here), so the relay stops cleanly within its grace period (exit 0); with a
// grace shorter than that, it exits at its grace, 3 (a runtime failure), saying so.
func TestRelayStopsWithinItsGrace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		grace time.Duration
		code  int
	}{{4 * time.Second, 0}, {300 * time.Millisecond, 3}} {
		t.Run(c.grace.String(), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			qs := qstashtest.NewTestServer(t, qstashtest.Options{})
			outboxtest.Enqueue(t, db.Pool, outboxtest.Orders(0, 10, outboxtest.Mod(10)))
			bg := context.Background()
			tx := db.LockTable(t, "outbox")
			// Its own application_name: the wait below must see this relay's claim, not
			// another test's (the subtests run in parallel on one database).
			app := "grace_" + strings.ReplaceAll(c.grace.String(), ".", "_")
			vars := map[string]string{"DATABASE_URL": db.URL + "&application_name=" + app, "QSTASH_URL": qs.URL, "QSTASH_TOKEN": qs.Token, "PUBLIC_BASE_URL": "http://127.0.0.1:1",
				"ORDERING": "publish", "LEASE": "7s", "PUBLISH_TIMEOUT": "1s"}
			stderr := &logtest.Buffer{}
			e := env{stdout: io.Discard, stderr: stderr, getenv: func(k string) string { return vars[k] }}
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, e, []string{"relay", "--listen", "127.0.0.1:0", "--retention-interval", "0", "--grace", c.grace.String()})
			}()
			// The claim waits on the lock: its statement's opening (pg_stat_activity keeps
			// the first track_activity_query_size bytes), not the gauge's or the circuits'
			// read, which wait too.
			testwait.Eventually(t, 15*time.Second, func() bool {
				var n int
				if err := db.Pool.QueryRow(bg, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%WITH ended AS MATERIALIZED%' AND application_name = $1`, app).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n > 0
			}, "a claim waiting on the lock")
			cancel() // SIGTERM
			start := time.Now()
			select {
			case code := <-done:
				took := time.Since(start)
				if code != c.code || took > c.grace+time.Second {
					t.Fatalf("exit %d after %v, want %d within the %v grace:\n%s", code, took, c.code, c.grace, stderr.String())
				}
				if c.code != 0 && !strings.Contains(stderr.String(), "relay did not stop within its grace period") {
					t.Fatalf("no grace message:\n%s", stderr.String())
				}
			case <-time.After(c.grace + 15*time.Second):
				_ = tx.Rollback(bg)
				<-done
				t.Fatalf("relay still running %v after SIGTERM, grace %v:\n%s", time.Since(start), c.grace, stderr.String())
			}
		})
	}
}
