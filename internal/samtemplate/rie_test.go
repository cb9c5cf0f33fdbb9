package samtemplate_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/awstest"
	"github.com/outbox-relay/outbox-relay/v3/internal/lambdatest"
	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

var buildDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deploy-test-")
	if err != nil {
		panic(err)
	}
	buildDir = dir
	code := awstest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	buildMu  sync.Mutex
	built    = map[string]string{}
	buildErr = map[string]error{}
)

// binary builds pkg once per test run: bootstraps as lambdatest.Build makes them, other
// commands plainly.
func binary(t *testing.T, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs Lambda bootstraps under aws-lambda-rie")
	}
	lambdatest.RequireRIE(t)
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok || buildErr[pkg] != nil {
		if buildErr[pkg] != nil {
			t.Fatal(buildErr[pkg])
		}
		return p
	}
	dir := filepath.Join(buildDir, strings.NewReplacer("/", "_", ".", "_").Replace(pkg))
	var p string
	var err error
	if strings.HasPrefix(pkg, "./functions/") {
		p, err = lambdatest.Build(context.Background(), pkg, dir)
	} else {
		p = filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", p, pkg)
		cmd.Dir = root(t)
		if out, e := cmd.CombinedOutput(); e != nil {
			err = &buildError{pkg, e, out}
		}
	}
	built[pkg], buildErr[pkg] = p, err
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type buildError struct {
	pkg string
	err error
	out []byte
}

func (e *buildError) Error() string {
	return "build " + e.pkg + ": " + e.err.Error() + "\n" + string(e.out)
}

// signEvent runs `outboxctl sign-event` on a sample event, as a user does before a local
// invoke.
func signEvent(t *testing.T, event string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(binary(t, "./cmd/outboxctl"), append([]string{"sign-event", "-in", filepath.Join(root(t), event)}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // the dev keys, whatever the caller's environment
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("outboxctl sign-event %s: %v", event, err)
	}
	return out
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func invoke(t *testing.T, f *lambdatest.Function, payload []byte) lambdatest.Response {
	t.Helper()
	resp, err := f.Invoke(ctxT(t, 2*time.Minute), payload)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// urlResponse decodes a receiver's Function URL response.
func urlResponse(t *testing.T, r lambdatest.Response) lambdatest.URLResponse {
	t.Helper()
	var out lambdatest.URLResponse
	if err := r.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// exampleDB is a fresh schema with the outbox's tables and the example consumer's, as
// `outboxctl migrate up --example` leaves a deployment's database.
func exampleDB(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.New(t)
	if err := orders.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	return db
}

// startReceiver starts the receiver function built from pkg, named as the template names
// it, under the emulator on an exampleDB with receiverEnv.
func startReceiver(t *testing.T, pkg, name string) (*lambdatest.Function, *pgtest.DB) {
	t.Helper()
	bin := binary(t, pkg)
	db := exampleDB(t)
	return lambdatest.Start(t, lambdatest.Options{Bootstrap: bin, Name: name, Timeout: 15 * time.Second, Env: receiverEnv(db)}), db
}

func count(t *testing.T, pool *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// receiverEnv is a receiver's local environment: the database and the dev signing keys,
// no public URL (so it verifies against https://<domainName><rawPath>).
func receiverEnv(db *pgtest.DB) map[string]string {
	return map[string]string{
		"DATABASE_URL":               db.URL,
		"QSTASH_CURRENT_SIGNING_KEY": qstash.DevCurrentSigningKey,
		"QSTASH_NEXT_SIGNING_KEY":    qstash.DevNextSigningKey,
		"LOG_LEVEL":                  "debug",
	}
}

type relayResult struct {
	Task              string  `json:"task"`
	Claimed           int     `json:"claimed"`
	Dispatched        int     `json:"dispatched"`
	Released          int     `json:"released"`
	Retried           int     `json:"retried"`
	StoppedAtDeadline bool    `json:"stopped_at_deadline"`
	BacklogPending    *int64  `json:"backlog_pending"`
	OutboxDeleted     int64   `json:"outbox_deleted"`
	ProcessedDeleted  int64   `json:"processed_deleted"`
	Complete          *bool   `json:"complete"`
	OldestPendingAge  float64 `json:"oldest_pending_age_seconds"`
}

// TestRIEScheduledDrainEndToEnd deploys the three built functions as the template wires
// them: the relay resolves its database secret and QStash token from Secrets Manager and SSM
// (moto_server), learns the receivers' URLs with the trailing "/" a FunctionUrl has, and
// publishes to the local QStash, which delivers over TLS to emulated Function URLs whose
// functions verify the signature against https://<domainName><rawPath>. A delivery is
// only processed if the relay published byte-for-byte the URL the webhook rebuilds.
//
// Then both secrets rotate under the warm functions: the database password (role and
// secret, every session dropped, as a frozen environment's sockets die) and the QStash
// token (SSM parameter and QStash). The relay's and the webhook's next invocations succeed
// without a cold start: each re-reads the secret once on the password's refusal, and the
// relay re-reads the token once on QStash's 401. Last, the signing keys roll twice under
// the warm receivers, which re-read them on the first signature neither key matches.
func TestRIEScheduledDrainEndToEnd(t *testing.T) {
	t.Parallel()
	relayBin, webhookBin, failureBin := binary(t, "./functions/relay"), binary(t, "./functions/webhook"), binary(t, "./functions/failure")
	// Secrets as deployed: the RDS JSON in Secrets Manager, QStash values in SSM
	// SecureStrings; the database demands the secret's password, as RDS does.
	aws := awstest.New(t)
	db := aws.StartDB(t)
	ctx := ctxT(t, 3*time.Minute)
	app, err := pgxpool.New(ctx, db.AppAdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	// The tables belong to the role the functions log in as, as a deploy's migration makes them.
	owner, err := pgxpool.New(ctx, fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/app?sslmode=disable", awstest.DBUser, awstest.FirstPassword, db.Cluster.Port))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Migrate(ctx, owner, nil); err != nil {
		t.Fatal(err)
	}
	if err := orders.Migrate(ctx, owner); err != nil {
		t.Fatal(err)
	}
	owner.Close()
	aws.PutParameter(t, "/outbox-relay/qstash/token", qstash.DevToken)
	aws.PutParameter(t, "/outbox-relay/qstash/current-signing-key", qstash.DevCurrentSigningKey)
	aws.PutParameter(t, "/outbox-relay/qstash/next-signing-key", qstash.DevNextSigningKey)
	deployed := func(extra map[string]string) map[string]string {
		env := aws.Env()
		env["DB_SECRET_ARN"], env["DB_SSLMODE"], env["LOG_LEVEL"] = db.SecretARN, "disable", "debug"
		for k, v := range extra {
			env[k] = v
		}
		return env
	}
	receiverParams := map[string]string{
		"QSTASH_CURRENT_SIGNING_KEY_PARAM": "/outbox-relay/qstash/current-signing-key",
		"QSTASH_NEXT_SIGNING_KEY_PARAM":    "/outbox-relay/qstash/next-signing-key",
	}

	webhook := lambdatest.Start(t, lambdatest.Options{Bootstrap: webhookBin, Name: "WebhookFunction", Timeout: 15 * time.Second, Env: deployed(receiverParams)})
	failure := lambdatest.Start(t, lambdatest.Options{Bootstrap: failureBin, Name: "FailureFunction", Timeout: 15 * time.Second, Env: deployed(receiverParams)})
	webhookURL := lambdatest.NewFunctionURL(webhook)
	defer webhookURL.Close()
	failureURL := lambdatest.NewFunctionURL(failure)
	defer failureURL.Close()

	roots := x509.NewCertPool()
	roots.AddCert(webhookURL.Certificate())
	roots.AddCert(failureURL.Certificate())
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig.RootCAs = roots
	qs := qstashtest.NewServer(qstashtest.Options{HTTPClient: &http.Client{Transport: tr, Timeout: time.Minute}, TimeScale: 0.0001})
	defer qs.Close()

	relay := lambdatest.Start(t, lambdatest.Options{Bootstrap: relayBin, Name: "RelayFunction", Timeout: 50 * time.Second, Env: deployed(map[string]string{
		"QSTASH_URL": qs.URL, "QSTASH_TOKEN_PARAM": "/outbox-relay/qstash/token",
		"PUBLIC_BASE_URL": webhookURL.URL + "/", "FAILURE_CALLBACK_URL": failureURL.URL + "/",
		"QSTASH_RETRIES": "1",
	})})

	orderEvents := func(from, n int) []outbox.Event {
		var events []outbox.Event
		for i := from; i < from+n; i++ {
			events = append(events, outbox.Event{Topic: "order.created", PartitionKey: "cust-" + strconv.Itoa(i),
				Payload: json.RawMessage(`{"order_id":"ord-` + strconv.Itoa(i) + `","amount_cents":` + strconv.Itoa(100*(i+1)) + `,"currency":"EUR"}`)})
		}
		return events
	}
	// A payload the handler rejects permanently: 489 -> failure callback -> dead letter.
	events := append(orderEvents(0, 4), outbox.Event{Topic: "order.created", PartitionKey: "cust-poison", Payload: json.RawMessage(`{"order_id":"ord-poison","amount_cents":-1,"currency":"EUR"}`)})
	if _, err := outbox.EnqueueBatch(ctx, app, events); err != nil {
		t.Fatal(err)
	}
	drain := func(what string, want int) {
		t.Helper()
		var res relayResult
		if err := invoke(t, relay, readFile(t, "events/schedule.json")).Decode(&res); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, relay.Log())
		}
		if res.Task != "drain" || res.Claimed != want || res.Dispatched != want || res.BacklogPending == nil || *res.BacklogPending != 0 {
			t.Fatalf("%s: result %+v, want %d claimed and dispatched, backlog 0\n%s", what, res, want, relay.Log())
		}
		if err := qs.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// applied: each valid event charged once, each poison event one delivery dead letter
	// (recorded by the failure function from QStash's callback).
	applied := func(what string, charges, letters int) {
		t.Helper()
		if n := count(t, app, "select count(*) from billing_charges"); n != charges {
			t.Errorf("%s: %d charges, want %d", what, n, charges)
		}
		if n := count(t, app, "select count(*) from dead_letters where source = 'delivery' and topic = 'order.created'"); n != letters {
			t.Errorf("%s: %d delivery dead letters, want %d", what, n, letters)
		}
	}
	drain("drain", 5)
	applied("drain", 4, 1)
	for _, a := range qs.Attempts() {
		if !a.FailureCallback && a.Status != http.StatusOK && a.Status != 489 {
			t.Errorf("delivery to %s answered %d (a signature/URL mismatch answers 401)", a.URL, a.Status)
		}
		if a.FailureCallback && a.Status != http.StatusOK {
			t.Errorf("failure callback to %s answered %d", a.URL, a.Status)
		}
		if strings.Contains(strings.TrimPrefix(a.URL, "https://"), "//") {
			t.Errorf("published URL %s has a doubled slash", a.URL)
		}
	}
	// Secrets were read once per cold start, not per invocation.
	drain("second drain", 0)
	if n := aws.Requests(awstest.TargetGetSecretValue); n != 3 {
		t.Errorf("%d secret reads for three cold starts", n)
	}
	if n := aws.Requests(awstest.TargetGetParameters); n != 3 {
		t.Errorf("%d parameter reads for three cold starts", n)
	}

	db.Rotate(t, "second-password")
	db.TerminateSessions(t)
	aws.PutParameter(t, "/outbox-relay/qstash/token", "rotated-token")
	qs.SetToken("rotated-token")
	if _, err := outbox.EnqueueBatch(ctx, app, orderEvents(4, 3)); err != nil {
		t.Fatal(err)
	}
	// Invoked back to back (within pgxpool's one second of reuse without a ping), the
	// relay's claim meets a dead session first, and its one retry opens a connection that
	// the rotated password refuses: the store then opens one more, which the connect
	// hook's re-read lets in (outboxstore.live), and the invocation succeeds.
	drain("drain after the rotations", 3)
	applied("drain after the rotations", 7, 1)
	// One re-read each by the relay and the webhook (the failure function had nothing to
	// do), and the token once by the relay; no cold start.
	if n := aws.Requests(awstest.TargetGetSecretValue); n != 5 {
		t.Errorf("%d secret reads, want 5: three cold starts, one re-read by the relay and one by the webhook\n%s", n, relay.Log())
	}
	if n := aws.Requests(awstest.TargetGetParameters); n != 4 {
		t.Errorf("%d parameter reads, want 4: three cold starts and the relay's token re-read\n%s", n, relay.Log())
	}

	// Upstash's signing keys roll twice (the console's "Roll signing keys"), leaving
	// neither key the receivers started with, and the new pair goes into SSM; no cold
	// start follows. Each receiver's first request signed with a key it has not seen
	// re-reads both parameters once and verifies: no delivery or callback is refused.
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, qs.URL+"/v2/keys/rotate", nil)
		req.Header.Set("Authorization", "Bearer rotated-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("roll the signing keys: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	current, next := qs.Keys()
	aws.PutParameter(t, "/outbox-relay/qstash/current-signing-key", current)
	aws.PutParameter(t, "/outbox-relay/qstash/next-signing-key", next)
	poison := outbox.Event{Topic: "order.created", PartitionKey: "cust-poison-2", Payload: json.RawMessage(`{"order_id":"ord-poison-2","amount_cents":-1,"currency":"EUR"}`)}
	if _, err := outbox.EnqueueBatch(ctx, app, append(orderEvents(7, 2), poison)); err != nil {
		t.Fatal(err)
	}
	drain("drain after the key roll", 3)
	applied("drain after the key roll", 9, 2)
	if n := aws.Requests(awstest.TargetGetParameters); n != 6 {
		t.Errorf("%d parameter reads, want 6: four before, then both keys in one read by the webhook and one by the failure function\n%s", n, webhook.Log())
	}
	for _, a := range qs.Attempts() {
		if a.Status == http.StatusUnauthorized {
			t.Errorf("delivery to %s refused (401)", a.URL)
		}
	}
}

func TestRIERetention(t *testing.T) {
	t.Parallel()
	relayBin := binary(t, "./functions/relay")
	db := exampleDB(t)
	ctx := ctxT(t, time.Minute)
	// Dispatched 8 and 1 days ago; processed 15 and 1 days ago. Defaults: 7d / 14d.
	_, err := db.Pool.Exec(ctx, `
INSERT INTO outbox (topic, partition_key, payload, dispatched_at)
VALUES ('t', 'k', '{}', now() - interval '8 days'), ('t', 'k', '{}', now() - interval '8 days'),
       ('t', 'k', '{}', now() - interval '1 day'), ('t', 'k', '{}', NULL);
INSERT INTO processed_messages (consumer, message_id, processed_at)
VALUES ('webhook', 'old', now() - interval '15 days'), ('webhook', 'new', now() - interval '1 day');`)
	if err != nil {
		t.Fatal(err)
	}
	relay := lambdatest.Start(t, lambdatest.Options{Bootstrap: relayBin, Name: "RelayFunction", Timeout: 30 * time.Second, Env: map[string]string{
		"DATABASE_URL": db.URL, "QSTASH_URL": "http://127.0.0.1:1", "QSTASH_TOKEN": qstash.DevToken,
		"PUBLIC_BASE_URL": "https://example.lambda-url.eu-west-1.on.aws/",
	}})
	var res relayResult
	if err := invoke(t, relay, readFile(t, "events/retention.json")).Decode(&res); err != nil {
		t.Fatalf("retention: %v\n%s", err, relay.Log())
	}
	if res.Task != "retention" || res.OutboxDeleted != 2 || res.ProcessedDeleted != 1 || res.Complete == nil || !*res.Complete {
		t.Fatalf("retention result %+v, want 2 outbox and 1 processed deleted, complete", res)
	}
	if n := db.Count(t, "select count(*) from outbox"); n != 2 {
		t.Errorf("%d outbox rows left, want 2 (recent and pending)", n)
	}
	if n := db.Count(t, "select count(*) from processed_messages where message_id = 'new'"); n != 1 {
		t.Errorf("recent dedupe record deleted")
	}
}

func TestRIEWebhookSignedEventProcessedOnce(t *testing.T) {
	t.Parallel()
	f, db := startReceiver(t, "./functions/webhook", "WebhookFunction")

	// The committed sample's signature has long expired: refused, nothing applied.
	if r := urlResponse(t, invoke(t, f, readFile(t, "events/webhook.json"))); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("stale sample: status %d %s, want 401", r.StatusCode, r.Body)
	}
	signed := signEvent(t, "events/webhook.json")
	first := urlResponse(t, invoke(t, f, signed))
	if first.StatusCode != http.StatusOK || !strings.Contains(first.Body, "processed") {
		t.Fatalf("first delivery: %d %s\n%s", first.StatusCode, first.Body, f.Log())
	}
	again := urlResponse(t, invoke(t, f, signed))
	if again.StatusCode != http.StatusOK || !strings.Contains(again.Body, "duplicate") {
		t.Errorf("repeated delivery: %d %s, want 200 duplicate", again.StatusCode, again.Body)
	}
	if n := db.Count(t, "select count(*) from billing_charges where order_id = 'ord_1001' and amount_cents = 4200"); n != 1 {
		t.Errorf("%d charges for ord_1001, want exactly 1", n)
	}
	// Signed with the next key (rotation in progress): still accepted, still once.
	next := urlResponse(t, invoke(t, f, signEvent(t, "events/webhook.json", "-key", "next")))
	if next.StatusCode != http.StatusOK || !strings.Contains(next.Body, "duplicate") {
		t.Errorf("next-key delivery: %d %s", next.StatusCode, next.Body)
	}
	// Signed for another URL: the webhook rebuilds its own and refuses.
	other := urlResponse(t, invoke(t, f, signEvent(t, "events/webhook.json", "-url", "https://elsewhere.example/events/order.created?outbox_id=1001&generation=0")))
	if other.StatusCode != http.StatusUnauthorized {
		t.Errorf("signature for another URL: %d, want 401", other.StatusCode)
	}
}

// A delivery over MAX_BODY_BYTES is refused for good (489, non-retryable) and counted as
// RejectedDeliveries, the metric the rejection alarm watches: an oversized event must not
// leave only QStash's DLQ knowing.
func TestRIEOversizedDeliveryIsCounted(t *testing.T) {
	t.Parallel()
	db := exampleDB(t)
	env := receiverEnv(db)
	env["MAX_BODY_BYTES"] = "16" // the sample's body is 60 bytes
	f := lambdatest.Start(t, lambdatest.Options{Bootstrap: binary(t, "./functions/webhook"), Name: "WebhookFunction", Timeout: 15 * time.Second, Env: env})
	r := urlResponse(t, invoke(t, f, signEvent(t, "events/webhook.json")))
	if r.StatusCode != webhook.StatusNonRetryable || r.Headers[http.CanonicalHeaderKey(webhook.HeaderNonRetryable)] != "true" {
		t.Fatalf("oversized delivery: %d %v %s, want 489 non-retryable\n%s", r.StatusCode, r.Headers, r.Body, f.Log())
	}
	// The function's stdout reaches the log after the response does.
	testwait.Eventually(t, 10*time.Second, func() bool { return strings.Contains(f.Log(), `"`+metrics.RejectedDeliveries+`":1`) },
		"no %s metric for the oversized delivery", metrics.RejectedDeliveries)
	if n := db.Count(t, "select count(*) from billing_charges"); n != 0 {
		t.Errorf("%d charges from a refused delivery", n)
	}
}

func TestRIEFailureEventRecordsOneDeadLetter(t *testing.T) {
	t.Parallel()
	f, db := startReceiver(t, "./functions/failure", "FailureFunction")
	signed := signEvent(t, "events/failure.json")
	for i, want := range []string{"recorded", "duplicate"} {
		r := urlResponse(t, invoke(t, f, signed))
		if r.StatusCode != http.StatusOK || !strings.Contains(r.Body, want) {
			t.Fatalf("callback %d: %d %s, want 200 %s\n%s", i, r.StatusCode, r.Body, want, f.Log())
		}
	}
	if n := db.Count(t, `select count(*) from dead_letters where source = 'delivery'
		and qstash_message_id = 'msg_26hZCxZCuWyyTWPmSVBrNB882AMRP1TsgzpygELRcLWep' and status_code = 489`); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

// TestRIERelayReturnsBeforeFunctionTimeout: QStash answers every publish 503 after 1.5 s,
// one row per batch, twenty rows: thirty seconds of work against a 12 s function timeout
// (drain deadline 10 s; no batch starts with less than publish + mark timeout, 7 s, left).
// The drain must stop claiming at the Lambda deadline less its reserve and reply, instead
// of the emulator's "Task timed out" (which would also lose the metrics line), and leave
// every row pending for the next tick.
func TestRIERelayReturnsBeforeFunctionTimeout(t *testing.T) {
	t.Parallel()
	relayBin := binary(t, "./functions/relay")
	db := exampleDB(t)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(1500 * time.Millisecond):
			// A retryable answer for the one message (an item error): a 5xx for the whole
			// request would be an outage, which pauses the drain instead of keeping it busy.
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `[{"error":"unavailable"}]`)
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	const timeout = 12 * time.Second
	relay := lambdatest.Start(t, lambdatest.Options{Bootstrap: relayBin, Name: "RelayFunction", Timeout: timeout, Env: map[string]string{
		"DATABASE_URL": db.URL, "QSTASH_URL": slow.URL, "QSTASH_TOKEN": qstash.DevToken,
		"PUBLIC_BASE_URL": "https://example.lambda-url.eu-west-1.on.aws/", "PUBLISH_TIMEOUT": "2s", "BATCH_SIZE": "1",
	}})
	ctx := ctxT(t, time.Minute)
	var events []outbox.Event
	for i := range 20 {
		events = append(events, outbox.Event{Topic: "order.created", PartitionKey: "k" + strconv.Itoa(i), Payload: json.RawMessage(`{}`)})
	}
	if _, err := outbox.EnqueueBatch(ctx, db.Pool, events); err != nil {
		t.Fatal(err)
	}
	// Warm the environment first, so the measured invoke has no init phase.
	if r := invoke(t, relay, readFile(t, "events/retention.json")); r.Err() != nil {
		t.Fatalf("warm-up: %v", r.Err())
	}
	start := time.Now()
	resp := invoke(t, relay, readFile(t, "events/schedule.json"))
	elapsed := time.Since(start)
	if strings.HasPrefix(strings.TrimSpace(string(resp.Body)), "Task timed out") {
		t.Fatalf("the emulator timed the relay out after %v: the drain ignored the deadline\n%s", elapsed, relay.Log())
	}
	t.Logf("after %v: %s", elapsed, resp.Body)
	if elapsed >= timeout {
		t.Errorf("replied after %v, the function timeout is %v", elapsed, timeout)
	}
	var res relayResult
	if err := resp.Decode(&res); err != nil {
		t.Fatal(err)
	}
	if !res.StoppedAtDeadline || res.Claimed < 1 || res.Claimed >= 20 || res.Dispatched != 0 {
		t.Errorf("result %+v: want some rows claimed, none dispatched, stopped at the deadline", res)
	}
	if n := db.Count(t, "select count(*) from outbox where dispatched_at is null and dead_lettered_at is null"); n != 20 {
		t.Errorf("%d pending rows, want all 20 still pending", n)
	}
}

// TestRIERelayDrainsLargePayloadsWithinItsMemory drains a backlog of large events through
// the relay bootstrap as built, under aws-lambda-rie with the template's memory size in
// AWS_LAMBDA_FUNCTION_MEMORY_SIZE (and no GOMEMLIMIT: the relay derives it), and checks
// the bootstrap's peak resident set (VmHWM) against that memory: on Lambda a relay over
// it is killed before it marks, its batch is claimed again after the lease and killed
// again, and the backlog never moves. Every event must arrive once.
//
// Without the byte budgets (batch 1,000 x 8 in flight, whatever the payload size) the
// bootstrap peaked far over the 256 MB; see relay.DefaultMaxInFlightBytes for the figures.
func TestRIERelayDrainsLargePayloadsWithinItsMemory(t *testing.T) {
	t.Parallel()
	relayBin := binary(t, "./functions/relay")
	memMB := toInt(loadTemplate(t).Parameters["RelayMemorySize"]["Default"])
	if memMB <= 0 {
		t.Fatal("template.yaml: RelayMemorySize has no numeric default")
	}
	for _, tc := range []struct {
		name    string
		backlog []payloads
	}{
		// About 480 MB of payloads each, both well over the function's memory.
		{"30kB", []payloads{{16_000, 30_000, orderLines}}},
		{"400kB", []payloads{{1_200, 400_000, orderLines}}},
		// 400 kB that Postgres stores in about 4 kB, then 1 MB it cannot compress: the
		// stored size says nothing of the text, and the text-per-stored ratio the claims
		// learn from the first is wrong for the second. The claim's stored-size budget let the
		// first claim of every process take 1,000 of the 400 kB events (the relay peaked at
		// 792 MiB, OOM on Lambda, again in every process after it). A quarter of the
		// issue's 300 incompressible events: with all of them, by hand, see
		// relay.DefaultMaxInFlightBytes.
		{"compressible and incompressible", []payloads{{1_200, 400_000, repeatedLines}, {75, 1_000_000, incompressible}}},
	} {
		// One after the other: each holds ~500 MB of messages in this process's QStash.
		t.Run(tc.name, func(t *testing.T) {
			hwm := drainUnderRIE(t, relayBin, memMB, tc.backlog)
			t.Logf("%v: relay peak RSS (VmHWM) %.1f MiB, function memory %d MB", tc.backlog, float64(hwm)/1024, memMB)
			if hwm >= int64(memMB)<<10 {
				t.Errorf("relay peak RSS %.1f MiB, over the function's %d MB: Lambda would kill it before it marks", float64(hwm)/1024, memMB)
			}
		})
	}
}

// payloads are events of a backlog: events payloads of about size bytes each, made by
// kind (a statement of generate_series v, 0-15, and the size $1 that yields a payload).
type payloads struct {
	events, size int
	kind         string
}

func (p payloads) String() string { return fmt.Sprintf("%d events of %d bytes", p.events, p.size) }

// The payload kinds of drainUnderRIE's backlogs. Sixteen distinct payloads of each are
// enough; each row stores and sends its own copy.
const (
	// orderLines: JSON order lines with a random SKU each, which Postgres compresses by
	// about a third, so the claim meets compressed as well as plain values.
	orderLines = `jsonb_build_object('order', v, 'lines',
        (SELECT jsonb_agg(jsonb_build_object('sku', md5(v || '-' || i), 'qty', i % 7, 'note', 'gift wrap'))
         FROM generate_series(1, $1::int / 76) i))`
	// repeatedLines: the same order line over and over, stored about a hundredfold smaller.
	repeatedLines = `jsonb_build_object('order', v, 'lines',
        (SELECT jsonb_agg(jsonb_build_object('sku', 'SKU-000042', 'qty', 1, 'note', 'gift wrap, no invoice'))
         FROM generate_series(1, $1::int / 66)))`
	// incompressible: random hex digits, which Postgres stores as they are.
	incompressible = `jsonb_build_object('order', v, 'blob',
        (SELECT string_agg(md5(v || '-' || i || random()::text), '') FROM generate_series(1, $1::int / 32) i))`
)

// drainUnderRIE loads backlog, its parts one after the other, drains it through a fresh relay bootstrap under the emulator into the local
// QStash (payg plan: a 10 MB message limit), checks every event was delivered exactly
// once, and returns the bootstrap's VmHWM in KiB.
func drainUnderRIE(t *testing.T, relayBin string, memMB int, backlog []payloads) int64 {
	db := pgtest.New(t)
	ctx := ctxT(t, 10*time.Minute)
	outboxtest.Exec(t, db.Pool, `CREATE TABLE load (part int, n int, payload jsonb)`)
	events := 0
	for i, p := range backlog {
		outboxtest.Exec(t, db.Pool, `
INSERT INTO load
SELECT `+strconv.Itoa(i)+`, g, q.payload
FROM generate_series(1, $2::int) g
JOIN (SELECT v, `+p.kind+` AS payload FROM generate_series(0, 15) v) q ON q.v = g % 16`, p.size, p.events)
		events += p.events
		var avg float64
		if err := db.Pool.QueryRow(ctx, `SELECT avg(octet_length(payload::text)) FROM load WHERE part = $1`, i).Scan(&avg); err != nil {
			t.Fatal(err)
		}
		if avg < 0.9*float64(p.size) || avg > 1.1*float64(p.size) {
			t.Fatalf("%v: payloads average %.0f bytes, want about %d", p, avg, p.size)
		}
	}
	outboxtest.Exec(t, db.Pool, `
INSERT INTO outbox (topic, partition_key, payload)
SELECT 'order.created', 'cust-' || (row_number() OVER (ORDER BY part, n) % 100), payload FROM load ORDER BY part, n`)

	sink := newDeliverySink(t)
	qs := qstashtest.NewServer(qstashtest.Options{Plan: qstash.PlanPayg, HTTPClient: &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 128}, Timeout: time.Minute}})
	defer qs.Close()

	// A copy of its own, so the bootstrap's process is found by its executable.
	bin := filepath.Join(t.TempDir(), "bootstrap")
	copyFile(t, relayBin, bin)
	relay := lambdatest.Start(t, lambdatest.Options{Bootstrap: bin, Name: "RelayFunction", Timeout: 120 * time.Second, Env: map[string]string{
		"DATABASE_URL": db.URL, "QSTASH_URL": qs.URL, "QSTASH_TOKEN": qs.Token, "QSTASH_PLAN": string(qstash.PlanPayg),
		"PUBLIC_BASE_URL": sink.URL + "/", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": strconv.Itoa(memMB),
		// A publish that timed out on a slow machine is retried within seconds, not minutes.
		"BACKOFF_BASE": "1s", "BACKOFF_MAX": "2s",
	}})
	dispatched := 0
	// Invoked as the schedule would, until the backlog is empty: rows whose publish timed
	// out become ready again after their backoff (or lease).
	deadline := time.Now().Add(5 * time.Minute)
	for i := 0; ; i++ {
		var res relayResult
		if err := invoke(t, relay, readFile(t, "events/schedule.json")).Decode(&res); err != nil {
			t.Fatalf("drain %d: %v\n%s", i, err, tail(relay.Log(), 4000))
		}
		dispatched += res.Dispatched
		if res.BacklogPending != nil && *res.BacklogPending == 0 {
			break
		}
		if res.Claimed == 0 {
			time.Sleep(time.Second) // the next tick
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d drains %d of %d dispatched (relay peak RSS %.1f MiB), last %+v\n%s", i+1, dispatched, events,
				float64(vmHWMKiB(t, bin))/1024, res, tail(relay.Log(), 3000))
		}
	}
	hwm := vmHWMKiB(t, bin)
	if err := qs.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if dispatched != events {
		t.Errorf("%d dispatched, want %d", dispatched, events)
	}
	sink.check(t, events)
	return hwm
}

// deliverySink is a destination that counts the deliveries of each outbox event.
type deliverySink struct {
	*httptest.Server
	mu        sync.Mutex
	delivered map[string]int // by outbox_id
}

func newDeliverySink(t *testing.T) *deliverySink {
	s := &deliverySink{delivered: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.delivered[r.URL.Query().Get("outbox_id")]++
		s.mu.Unlock()
	}))
	t.Cleanup(s.Close)
	return s
}

// check fails t unless events distinct events were delivered, each once; it returns
// their outbox ids.
func (s *deliverySink) check(t *testing.T, events int) []string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.delivered) != events {
		t.Errorf("%d distinct events delivered, want %d", len(s.delivered), events)
	}
	ids := make([]string, 0, len(s.delivered))
	for id, n := range s.delivered {
		if n != 1 {
			t.Errorf("event %s delivered %d times", id, n)
		}
		ids = append(ids, id)
	}
	return ids
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// vmHWMKiB returns the peak resident set of the one running process whose executable is
// exe (the emulator starts the bootstrap as its child and keeps it between invokes).
func vmHWMKiB(t *testing.T, exe string) int64 {
	t.Helper()
	var found []int64
	for _, d := range procsOf(t, exe) {
		f, err := os.Open(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		s := bufio.NewScanner(f)
		for s.Scan() {
			if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
				var kib int64
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib); err == nil {
					found = append(found, kib)
				}
			}
		}
		f.Close()
	}
	if len(found) != 1 {
		t.Fatalf("want one running %s with a VmHWM, found %d (is /proc mounted?)", exe, len(found))
	}
	return found[0]
}

// procsOf returns the /proc directories of the running processes whose executable is exe.
func procsOf(t *testing.T, exe string) []string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, d := range dirs {
		if p, err := os.Readlink(filepath.Join(d, "exe")); err == nil && p == exe {
			found = append(found, d)
		}
	}
	return found
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
