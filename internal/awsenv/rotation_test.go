package awsenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/awstest"
	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// appDB is a database whose password is in a Secrets Manager secret on moto, resolved
// into a DATABASE_URL as a function's cold start does.
type appDB struct {
	*awstest.DB
	acct   *awstest.Account
	r      awsenv.Resolver
	env    func(string) string // the function's environment: DB_SECRET_ARN
	getenv func(string) string // resolved: DATABASE_URL
}

func startAppDB(t *testing.T, ctx context.Context) *appDB {
	t.Helper()
	a := &appDB{}
	a.r, a.acct = resolver(t)
	a.DB = a.acct.StartDB(t)
	a.env = envOf(map[string]string{awsenv.VarDBSecretARN: a.SecretARN, awsenv.VarDBSSLMode: "disable"})
	var err error
	if a.getenv, err = a.r.Resolve(ctx, a.env); err != nil {
		t.Fatal(err)
	}
	return a
}

// open opens a pool on a's resolved DATABASE_URL with cfg and credentials of its own that
// re-read the secret, as a function's cold start does; it closes when the test ends.
func (a *appDB) open(t *testing.T, ctx context.Context, cfg awsenv.PoolConfig) (*pgxpool.Pool, *awsenv.Credentials) {
	t.Helper()
	cfg.Credentials = awsenv.NewCredentials(a.r.DatabaseURLReader(a.env))
	pool, err := awsenv.NewPool(ctx, a.getenv("DATABASE_URL"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, cfg.Credentials
}

// admin connects to a's database as the superuser, over the socket the rotations leave
// alone; it closes when the test ends.
func (a *appDB) admin(t *testing.T, ctx context.Context) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, a.AppAdminURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// failures records what failed and when.
type failures struct {
	mu sync.Mutex
	at []time.Time
	e  []string
}

func (f *failures) add(what string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.at = append(f.at, time.Now())
	f.e = append(f.e, what)
}

func (f *failures) since(t time.Time) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for i, at := range f.at {
		if at.After(t) {
			out = append(out, f.e[i])
		}
	}
	return out
}

// deliver is the relay's publisher for this test (as a relay.PublisherFunc): it delivers
// each message straight to the webhook at base the way QStash would (the identity in the
// signed URL), and reports anything but 200 as a retryable failure, also added to fails.
func deliver(ctx context.Context, base string, fails *failures, msgs []outbox.Message) []publish.Result {
	res := make([]publish.Result, len(msgs))
	for i, m := range msgs {
		target := fmt.Sprintf("%s/events/%s?outbox_id=%d&generation=%d", base, m.Topic, m.ID, m.Generation)
		sig, err := qstash.Sign(qstash.DevCurrentSigningKey, target, m.Payload, time.Now())
		if err != nil {
			res[i].Err = err
			continue
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(m.Payload))
		req.Header.Set("Upstash-Signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			res[i].Err = err
			fails.add("deliver: " + err.Error())
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			res[i].Err = fmt.Errorf("webhook answered %d %s", resp.StatusCode, body)
			fails.add(res[i].Err.Error())
		}
	}
	return res
}

// TestPasswordRotationWhileRunning rotates the database password (the secret on moto and
// the role together, as RDS rotation does) while a relay loop and a webhook run on pools opened
// once, then drops every open session, as a frozen Lambda environment's sockets die. The
// first new connections are refused (28P01); each pool re-reads the secret once and carries
// on: after the rotation settles no delivery fails, every event is processed once, and the
// pools are the ones opened at the start (no cold start). Without the refresh every new
// connection stays refused until the environment is recycled.
func TestPasswordRotationWhileRunning(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a := startAppDB(t, ctx)
	// Two pools with their own credentials, as the relay and webhook functions have.
	relayPool, relayCreds := a.open(t, ctx, awsenv.PoolConfig{MaxConns: 3})
	hookPool, hookCreds := a.open(t, ctx, awsenv.PoolConfig{MaxConns: 3})
	if _, err := postgres.Migrate(ctx, relayPool, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := relayPool.Exec(ctx, `CREATE TABLE effects (message_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}

	fails := &failures{}
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	var hook atomic.Pointer[http.Handler]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*hook.Load()).ServeHTTP(w, r) }))
	defer srv.Close()
	wh, err := webhook.New(webhook.Config{Pool: hookPool, Verifier: v, PublicBaseURL: srv.URL, Logger: slog.New(slog.DiscardHandler),
		Handlers: webhook.Handlers{"order.created": func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, d.MessageID)
			return err
		}}})
	if err != nil {
		t.Fatal(err)
	}
	handler := hookCreds.Handler(hookPool, wh) // the webhook function's wiring
	hook.Store(&handler)
	pub := relay.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []publish.Result {
		return deliver(ctx, srv.URL, fails, msgs)
	})
	rl, err := relay.New(relayPool, pub,
		relay.Config{BackoffBase: time.Second, BackoffMax: 2 * time.Second, MaxAttempts: 1000, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}

	// The producer writes over the admin socket; the relay loop is one "invocation" after
	// another, each starting as the relay function's does.
	var produced atomic.Int64
	produce := func(db outbox.Querier, n int) {
		for range n {
			p := fmt.Sprintf(`{"n":%d}`, produced.Add(1))
			if _, err := outbox.Enqueue(ctx, db, outbox.Event{Topic: "order.created", PartitionKey: "k", Payload: json.RawMessage(p)}); err != nil {
				t.Error(err)
			}
		}
	}
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	var invocations atomic.Int64
	go func() {
		defer close(loopDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := relayCreds.Ready(ctx, relayPool); err != nil {
				fails.add("relay ready: " + err.Error())
			}
			if _, err := rl.Drain(ctx); err != nil {
				fails.add("relay drain: " + err.Error())
			}
			invocations.Add(1)
		}
	}()
	appAdmin := a.admin(t, ctx)
	processed := func() int64 {
		var n int64
		if err := appAdmin.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		testwait.EventuallyNil(t, 60*time.Second, func() error {
			if ok() {
				return nil
			}
			f := fails.since(time.Time{})
			return fmt.Errorf("%s; %d failures, the last: %v", what, len(f), f[max(0, len(f)-3):])
		})
	}
	stopLoop := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-loopDone
	}
	defer stopLoop()

	produce(appAdmin, 30)
	waitFor("30 events before the rotation", func() bool { return processed() == 30 })
	startPools := [2]*pgxpool.Pool{relayPool, hookPool}
	conns := relayPool.Stat().NewConnsCount() + hookPool.Stat().NewConnsCount()

	// Rotate: the role's password and the secret change; then every open session dies.
	a.Rotate(t, "second-password")
	a.TerminateSessions(t)
	// pgxpool finds a dead idle socket by pinging it before use once it has been idle a
	// second (a frozen environment's always have); Reset is that discovery, without waiting.
	relayPool.Reset()
	hookPool.Reset()
	// Settled: an invocation that may have been cut off mid-query has ended and a whole
	// one has run since.
	n := invocations.Load()
	waitFor("two invocations after the rotation", func() bool { return invocations.Load() >= n+2 })
	settled := time.Now()

	produce(appAdmin, 100)
	waitFor("130 events after the rotation", func() bool { return processed() == 130 })
	n = invocations.Load()
	waitFor("more invocations", func() bool { return invocations.Load() >= n+3 })
	stopLoop()

	if f := fails.since(settled); len(f) > 0 {
		t.Fatalf("%d failures after the rotation settled: %v", len(f), f)
	}
	if relayCreds.Reads() != 1 || hookCreds.Reads() != 1 {
		t.Fatalf("secret re-read %d (relay) and %d (webhook) times, want once each", relayCreds.Reads(), hookCreds.Reads())
	}
	if relayPool.Stat().NewConnsCount()+hookPool.Stat().NewConnsCount() <= conns {
		t.Fatal("no new connection was opened after the rotation: the test did not exercise the refresh")
	}
	if startPools != [2]*pgxpool.Pool{relayPool, hookPool} {
		t.Fatal("pools replaced")
	}
	var dup int64
	if err := appAdmin.QueryRow(ctx, `SELECT count(*) - count(DISTINCT message_id) FROM processed_messages`).Scan(&dup); err != nil || dup != 0 {
		t.Fatalf("duplicate dedupe records %d %v", dup, err)
	}

	// A second rotation met by many callers at once: one re-read between them.
	a.Rotate(t, "third-password")
	hookPool.Reset() // no idle connection left: every caller must open one
	a.TerminateSessions(t)
	reads := a.acct.Requests(awstest.TargetGetSecretValue)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- hookCreds.Ready(ctx, hookPool) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Ready after the second rotation: %v", err)
		}
	}
	if hookCreds.Reads() != 2 || a.acct.Requests(awstest.TargetGetSecretValue) != reads+1 {
		t.Fatalf("concurrent refusals re-read the secret %d times, want once", a.acct.Requests(awstest.TargetGetSecretValue)-reads)
	}
}

// TestDatabaseURLReader: there is something to re-read only when the database URL came
// from a Secrets Manager secret with a password; what it reads is the secret's current
// value.
func TestDatabaseURLReader(t *testing.T) {
	t.Parallel()
	r, acct := resolver(t)
	secretARN := acct.CreateSecret(t, secretName, `{"username":"app","password":"zero","host":"db.internal","port":5432}`)
	for name, env := range map[string]map[string]string{
		"plain DATABASE_URL": {"DATABASE_URL": "postgres://u:p@h/db"},
		"IAM tokens":         {awsenv.VarDBSecretARN: secretARN, awsenv.VarDBIAMAuth: "true"},
		"nothing":            {},
	} {
		if r.DatabaseURLReader(envOf(env)) != nil {
			t.Errorf("%s: a reader, want none", name)
		}
	}
	read := r.DatabaseURLReader(envOf(map[string]string{awsenv.VarDBSecretARN: secretARN}))
	if read == nil {
		t.Fatal("DB_SECRET_ARN: no reader")
	}
	for _, pw := range []string{"one", "two"} {
		acct.PutSecretValue(t, secretARN, `{"username":"app","password":"`+pw+`","host":"db.internal","port":5432}`)
		dsn, err := read(context.Background())
		if err != nil || !bytes.Contains([]byte(dsn), []byte(":"+pw+"@")) {
			t.Fatalf("read %q %v, want the password %q", dsn, err, pw)
		}
	}
}

// countingPublisher counts publishes per outbox id. Its first calls wait (up to 5 s) until
// gate calls are in flight at once, so that many batches reach their marks together and
// the drain needs more connections than the pool holds idle.
type countingPublisher struct {
	gate int

	mu       sync.Mutex
	count    map[int64]int
	inFlight int
	opened   chan struct{}
}

func (p *countingPublisher) Publish(ctx context.Context, msgs []outbox.Message) []publish.Result {
	p.mu.Lock()
	for _, m := range msgs {
		p.count[int64(m.ID)]++
	}
	p.inFlight++
	if p.inFlight >= p.gate {
		select {
		case <-p.opened:
		default:
			close(p.opened)
		}
	}
	p.mu.Unlock()
	select {
	case <-p.opened:
	case <-time.After(5 * time.Second):
	case <-ctx.Done():
	}
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
	return make([]publish.Result, len(msgs))
}

// TestRotationWithOldSessionsOpen: RDS rotation changes the password and leaves open
// sessions alone. A warm relay pool holds one idle pre-rotation session, so Ready succeeds
// on it without re-reading anything; the drain then needs new connections (four batches
// in flight, each marked on its own) and every one is refused with 28P01. The first
// refusal makes the pool's next connection attempt re-read the secret, the store retries
// the refused statement once, and the drain completes: every row marked, each published
// once, one re-read, the pool the one opened at the start.
func TestRotationWithOldSessionsOpen(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a := startAppDB(t, ctx)
	const concurrency = 4
	var logs logtest.Buffer
	// The relay function's sizing: claim, one mark per batch in flight, the gauge.
	pool, creds := a.open(t, ctx, awsenv.PoolConfig{MaxConns: 2 + concurrency, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	const n = 400
	outboxtest.Enqueue(t, pool, outboxtest.Orders(0, n, outboxtest.Mod(n)))
	// Warm, with exactly one idle session from before the rotation.
	for pool.Stat().IdleConns() > 1 {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conn.Hijack().Close(ctx)
	}
	if pool.Stat().IdleConns() != 1 {
		t.Fatalf("%d idle sessions, want 1", pool.Stat().IdleConns())
	}
	opened := pool.Stat().NewConnsCount()

	a.Rotate(t, "second-password")
	if err := creds.Ready(ctx, pool); err != nil || creds.Reads() != 0 {
		t.Fatalf("Ready on the idle pre-rotation session: %v, %d re-reads; want success without one (the case this test is about)", err, creds.Reads())
	}

	pub := &countingPublisher{gate: concurrency, count: map[int64]int{}, opened: make(chan struct{})}
	rl, err := relay.New(pool, pub, relay.Config{BatchSize: 20, PublishConcurrency: concurrency, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	st, err := rl.Drain(ctx)
	if err != nil {
		t.Fatalf("drain after the rotation: %v (stats %+v)", err, st)
	}
	appAdmin := a.admin(t, ctx)
	var dispatched, leased int
	if err := appAdmin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE dispatched_at IS NOT NULL), count(*) FILTER (WHERE lease_token IS NOT NULL) FROM outbox`).Scan(&dispatched, &leased); err != nil {
		t.Fatal(err)
	}
	if dispatched != n || leased != 0 || st.Dispatched != n || st.LeaseLost != 0 {
		t.Fatalf("%d of %d rows dispatched, %d still leased; stats %+v", dispatched, n, leased, st)
	}
	pub.mu.Lock()
	for id, k := range pub.count {
		if k != 1 {
			t.Errorf("event %d published %d times", id, k)
		}
	}
	published := len(pub.count)
	pub.mu.Unlock()
	if published != n {
		t.Fatalf("%d events published, want %d", published, n)
	}
	if creds.Reads() != 1 || a.acct.Requests(awstest.TargetGetSecretValue) != 2 {
		t.Fatalf("%d re-reads (%d GetSecretValue calls), want 1 (and the one at start)", creds.Reads(), a.acct.Requests(awstest.TargetGetSecretValue))
	}
	if pool.Stat().NewConnsCount() <= opened {
		t.Fatal("the drain opened no connection: the test did not exercise the rotation")
	}
	if got := logs.String(); !bytes.Contains([]byte(got), []byte(`"msg":"database refused the password; secret re-read, new connections use it","reads":1`)) {
		t.Fatalf("no re-read logged:\n%s", got)
	}
}

// TestMustConnectAfterARotation: a command (MustConnect) that starts with a DATABASE_URL
// resolved before the password was rotated connects all the same: the refused password
// makes Credentials re-read the secret and the ping is tried once more.
func TestMustConnectAfterARotation(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	a := startAppDB(t, ctx)
	a.Rotate(t, "rotated-before-the-command")
	pool, err := awsenv.NewPool(ctx, a.getenv("DATABASE_URL"), awsenv.PoolConfig{
		MustConnect: true, Credentials: awsenv.NewCredentials(a.r.DatabaseURLReader(a.env))})
	if err != nil {
		t.Fatalf("connect after a rotation: %v", err)
	}
	pool.Close()
	if _, err := awsenv.NewPool(ctx, a.getenv("DATABASE_URL"), awsenv.PoolConfig{MustConnect: true}); err == nil {
		t.Fatal("the stale password connected without Credentials")
	}
}
