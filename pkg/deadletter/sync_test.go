package deadletter_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
	"github.com/outbox-relay/outbox-relay/v3/internal/localqstash"
	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// answering is an HTTP server that answers every request with status and counts them.
func answering(t *testing.T, status int) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if status == receive.StatusNonRetryable {
			w.Header().Set(receive.HeaderNonRetryable, "true")
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"error":"down for maintenance"}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// publishRows publishes the outbox rows ids through a real Publisher with cfg, as the relay
// does, and marks them dispatched.
func publishRows(t *testing.T, db *pgtest.DB, cfg qstash.PublisherConfig, ids []int64) {
	t.Helper()
	ctx := context.Background()
	p, err := qstash.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []outbox.Message
	for _, id := range ids {
		m := outbox.Message{ID: outbox.ID(id), Attempt: 1}
		var headers []byte
		if err := db.Pool.QueryRow(ctx, `SELECT topic, partition_key, payload::text, headers::text, generation FROM outbox WHERE id = $1`, id).
			Scan(&m.Topic, &m.PartitionKey, &m.Payload, &headers, &m.Generation); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	for i, r := range p.Publish(ctx, msgs) {
		if r.Err != nil {
			t.Fatalf("publish %d: %v", ids[i], r.Err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox SET dispatched_at = now(), attempts = 1 WHERE id = ANY($1)`, ids); err != nil {
		t.Fatal(err)
	}
}

// publishRaw publishes one message as another sender would, through QStash's single-publish
// API (queue "" means no queue).
func publishRaw(t *testing.T, qs *qstashtest.Server, queue, dest string, header map[string]string) {
	t.Helper()
	path := "/v2/publish/" + dest
	if queue != "" {
		path = "/v2/enqueue/" + queue + "/" + dest
	}
	h := http.Header{"Content-Type": {"application/json"}, "Upstash-Retries": {"0"}}
	for k, v := range header {
		h.Set(k, v)
	}
	if resp, body := localqstash.Call(t, qs, http.MethodPost, path, h, `{"order_id":"elsewhere"}`); resp.StatusCode/100 != 2 {
		t.Fatalf("publish to %s: %d %s", dest, resp.StatusCode, body)
	}
}

// serverDLQ is the DLQ of the local QStash server qs, read with token through a
// Publisher's client, as the relay reads it.
func serverDLQ(t *testing.T, qs *qstashtest.Server, token string) *qstash.DLQ {
	t.Helper()
	p, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: token, DestinationBaseURL: "https://hooks.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	return p.DLQ()
}

// barrierDLQ is the real DLQ, except that the first List of each of n callers returns only
// when all n have read their first page: n syncs then record the same entries at the same
// time.
type barrierDLQ struct {
	*qstash.DLQ
	arrived sync.WaitGroup
}

func (b *barrierDLQ) List(ctx context.Context, cursor string) ([]qstash.DLQEntry, string, error) {
	entries, next, err := b.DLQ.List(ctx, cursor)
	if cursor == "" {
		b.arrived.Done()
		b.arrived.Wait()
	}
	return entries, next, err
}

// syncSetup starts a schema, a local QStash server and a webhook that rejects every event
// (489 + Upstash-NonRetryable-Error): its DLQ entries are dead letters, where a 5xx's are
// rescheduled (TestSyncReschedulesOutage).
func syncSetup(t *testing.T) (*pgtest.DB, *qstashtest.Server, *httptest.Server) {
	t.Helper()
	db := pgtest.New(t)
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})
	webhook, _ := answering(t, receive.StatusNonRetryable)
	return db, qs, webhook
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestSyncRecordsQStashDLQOnce runs the real path: events published by the real publisher to a
// webhook that rejects them (489 + Upstash-NonRetryable-Error: the failure callback
// dead-letters that, where it reschedules a 5xx) fail in the local QStash server, some with no
// failure callback, some with a callback that answers 500 too, some with a working failure
// callback (the real handler). Two syncs run at once; then every event is in dead_letters
// exactly once, other deployments' entries are untouched, and --delete-synced removes what
// was recorded and nothing else.
func TestSyncRecordsQStashDLQOnce(t *testing.T) {
	t.Parallel()
	db, qs, webhook := syncSetup(t)
	ctx := context.Background()
	brokenCallback, brokenHits := answering(t, http.StatusInternalServerError)
	otherWebhook, _ := answering(t, http.StatusServiceUnavailable)
	// The real failure-callback handler; QStash signs callbacks with its exact URL.
	callbackSrv := httptest.NewUnstartedServer(nil)
	callbackURL := "http://" + callbackSrv.Listener.Addr().String() + "/failure"
	callbackSrv.Config.Handler = newCallbackHandler(t, db, func(c *deadletter.CallbackConfig) { c.FailureURL = callbackURL })
	callbackSrv.Start()
	t.Cleanup(callbackSrv.Close)

	var noCallback, badCallback, goodCallback, fifo []int64
	for i := range 12 {
		id := enqueue(t, db, "order.created", "order:"+strconv.Itoa(i), `{"order_id":"o-`+strconv.Itoa(i)+`"}`)
		switch i % 4 {
		case 0:
			noCallback = append(noCallback, id)
		case 1:
			badCallback = append(badCallback, id)
		case 2:
			goodCallback = append(goodCallback, id)
		default:
			fifo = append(fifo, id)
		}
	}
	base := qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: webhook.URL, Retries: 1}
	publishRows(t, db, base, noCallback)
	withBad := base
	withBad.FailureCallbackURL = brokenCallback.URL + "/failure"
	publishRows(t, db, withBad, badCallback)
	withGood := base
	withGood.FailureCallbackURL = callbackURL
	publishRows(t, db, withGood, goodCallback)
	ordered := base
	ordered.Ordering, ordered.FIFOQueues = publish.OrderingFIFO, 1
	publishRows(t, db, ordered, fifo)

	// Entries that are not this outbox's, with the same outbox ids: another deployment
	// (staging) on the same webhook, in its own FIFO queue; another webhook; a message with
	// no outbox identity.
	foreign := 0
	for _, id := range noCallback {
		publishRaw(t, qs, "staging-0", webhook.URL+"/events/order.created", map[string]string{
			"Upstash-Forward-X-Outbox-Id": itoa(id), "Upstash-Forward-X-Outbox-Generation": "0", "Upstash-Deduplication-Id": "staging-" + itoa(id)})
		publishRaw(t, qs, "", otherWebhook.URL+"/events/order.created", map[string]string{"Upstash-Forward-X-Outbox-Id": itoa(id)})
		foreign += 2
	}
	publishRaw(t, qs, "", webhook.URL+"/events/order.created", nil)
	foreign++

	ours := len(noCallback) + len(badCallback) + len(goodCallback) + len(fifo)
	localqstash.WaitIdle(t, qs)
	if n := len(qs.DLQ()); n != ours+foreign {
		t.Fatalf("QStash DLQ has %d entries, want %d", n, ours+foreign)
	}
	if brokenHits.Load() == 0 {
		t.Fatal("the broken failure callback was never called")
	}
	// The working callback recorded its letters already; the others exist only in QStash.
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != len(goodCallback) {
		t.Fatalf("%d letters before the sync, want the %d from the failure callback", n, len(goodCallback))
	}

	client := serverDLQ(t, qs, qs.Token)
	both := &barrierDLQ{DLQ: client}
	both.arrived.Add(2)
	cfg := deadletter.SyncConfig{DLQ: both, DestinationBaseURL: webhook.URL + "/", Logger: quiet()}
	var (
		wg      sync.WaitGroup
		results [2]deadletter.SyncResult
		errs    [2]error
	)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = deadletter.Sync(ctx, db.Pool, cfg)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	missing := ours - len(goodCallback)
	if got := results[0].Recorded + results[1].Recorded; got != missing {
		t.Fatalf("the two syncs recorded %d letters, want %d: %+v", got, missing, results)
	}
	for _, r := range results {
		if r.Scanned != ours+foreign || r.Foreign != foreign || r.Deleted != 0 || r.Pages != 1 {
			t.Fatalf("sync result %+v", r)
		}
	}

	// Exactly one letter per event, each one its event's QStash message, with the row's data.
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != ours {
		t.Fatalf("%d letters, want %d", n, ours)
	}
	all := slices.Concat(noCallback, badCallback, goodCallback, fifo)
	if n := db.Count(t, `SELECT count(DISTINCT outbox_id) FROM dead_letters WHERE outbox_id = ANY($1) AND source = 'delivery'`, all); n != ours {
		t.Fatalf("%d events have letters, want %d", n, ours)
	}
	synced := slices.Concat(noCallback, badCallback, fifo)
	if n := db.Count(t, `
SELECT count(*) FROM dead_letters d JOIN outbox o ON o.id = d.outbox_id
WHERE d.outbox_id = ANY($1) AND d.error = 'qstash delivery failed: HTTP 489 after 0 of 1 retries'
  AND d.status_code = 489 AND coalesce(d.attempts, 0) = 0 AND d.topic = o.topic AND d.partition_key = o.partition_key
  AND d.payload = o.payload AND d.response_body LIKE '%down for maintenance%' AND d.qstash_dlq_id IS NOT NULL
  AND d.resolved_at IS NULL AND o.dead_lettered_at IS NOT NULL`, synced); n != len(synced) {
		t.Fatalf("%d of %d synced letters carry the event's data and marked its row", n, len(synced))
	}
	// A synced letter and a callback letter of the same failure are one group.
	if n := db.Count(t, `SELECT count(DISTINCT fingerprint) FROM dead_letters`); n != 1 {
		t.Fatalf("%d groups, want 1", n)
	}

	// Syncing again adds nothing; --delete-synced then removes exactly this outbox's entries.
	cfg.DLQ = client
	again, err := deadletter.Sync(ctx, db.Pool, cfg)
	if err != nil || again.Recorded != 0 || again.AlreadyRecorded != ours {
		t.Fatalf("sync again: %+v %v", again, err)
	}
	del := cfg
	del.DeleteSynced = true
	res, err := deadletter.Sync(ctx, db.Pool, del)
	if err != nil || res.Deleted != ours || res.Recorded != 0 {
		t.Fatalf("sync --delete-synced: %+v %v", res, err)
	}
	left := qs.DLQ()
	if len(left) != foreign {
		t.Fatalf("%d entries left in QStash, want the %d foreign ones", len(left), foreign)
	}
	for _, e := range left {
		if e.Queue != "staging-0" && !strings.HasPrefix(e.URL, otherWebhook.URL) && !strings.HasPrefix(e.URL, webhook.URL) {
			t.Fatalf("left %+v", e)
		}
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters`); n != ours {
		t.Fatalf("%d letters after deleting from QStash, want %d", n, ours)
	}
}

// TestSyncSupersededAndPaging: an entry about a generation the row has left behind is
// recorded resolved and does not stop the redriven event; an event generation the relay
// dead-lettered already gets no second letter; every cursor page is read.
func TestSyncSupersededAndPaging(t *testing.T) {
	t.Parallel()
	db, qs, webhook := syncSetup(t)
	ctx := context.Background()
	var ids []int64
	for i := range 230 { // three pages of at most 100
		ids = append(ids, enqueue(t, db, "invoice.paid", "k"+strconv.Itoa(i), `{"n":1}`))
	}
	publishRows(t, db, qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: webhook.URL, Retries: qstash.NoRetries}, ids)
	localqstash.WaitIdle(t, qs)
	// The first event was redriven meanwhile (generation 1) and is being relayed again.
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox SET generation = 1, dispatched_at = NULL WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	// The relay gave up on the second one too (it never saw QStash accept it): that event
	// generation has its open letter already, and gets no second one.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO dead_letters (source, outbox_id, topic, error, generation) VALUES ('relay', $1, 'invoice.paid', 'publish timed out', 0)`, ids[1]); err != nil {
		t.Fatal(err)
	}
	res, err := deadletter.Sync(ctx, db.Pool, deadletter.SyncConfig{
		DLQ: serverDLQ(t, qs, qs.Token), DestinationBaseURL: webhook.URL, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Pages != 3 || res.Scanned != 230 || res.Recorded != 228 || res.Superseded != 1 || res.AlreadyRecorded != 1 {
		t.Fatalf("result %+v", res)
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE outbox_id = $1`, ids[1]); n != 1 {
		t.Fatalf("%d letters for the event the relay dead-lettered, want its 1", n)
	}
	if r := readOutbox(t, db, ids[0]); r.dead || r.gen != 1 {
		t.Fatalf("redriven row stopped by an old generation's entry: %+v", r)
	}
	var resolution string
	if err := db.Pool.QueryRow(ctx, `SELECT resolution FROM dead_letters WHERE outbox_id = $1 AND resolved_at IS NOT NULL`, ids[0]).Scan(&resolution); err != nil || resolution != deadletter.ResolutionSuperseded {
		t.Fatalf("superseded letter: %q %v", resolution, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE resolved_at IS NULL AND coalesce(attempts, 0) = 0 AND error LIKE '%after 0 of 0 retries'`); n != 228 {
		t.Fatalf("%d open letters with 0 retries, want 228", n)
	}
}

// TestSyncReschedulesOutage: DLQ entries whose failure callback never arrived are
// classified as the callback would: a transient failure (500, the consumer down) puts its
// row back to pending under a new generation and is recorded resolved, superseded; a 489
// is an open dead letter.
func TestSyncReschedulesOutage(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})
	down, _ := answering(t, http.StatusInternalServerError)
	ctx := context.Background()
	outage := enqueue(t, db, "invoice.paid", "a", `{"n":1}`)
	publishRows(t, db, qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: down.URL, Retries: 1}, []int64{outage})
	localqstash.WaitIdle(t, qs)
	res, err := deadletter.Sync(ctx, db.Pool, deadletter.SyncConfig{DLQ: serverDLQ(t, qs, qs.Token), DestinationBaseURL: down.URL, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rescheduled != 1 || res.Recorded != 0 || res.Superseded != 1 {
		t.Fatalf("result %+v, want the outage's entry rescheduled", res)
	}
	if r := readOutbox(t, db, outage); r.dead || r.dispatched || r.gen != 1 {
		t.Fatalf("row after the sync %+v, want pending at generation 1", r)
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE resolved_at IS NULL`); n != 0 {
		t.Fatalf("%d open letters for an outage", n)
	}
	// Synced again: nothing more (the entry is recorded, the row has moved on).
	if res, err := deadletter.Sync(ctx, db.Pool, deadletter.SyncConfig{DLQ: serverDLQ(t, qs, qs.Token), DestinationBaseURL: down.URL, Logger: quiet()}); err != nil || res.Rescheduled != 0 || res.AlreadyRecorded != 1 {
		t.Fatalf("second sync %+v %v", res, err)
	}
}

func TestSyncConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := deadletter.Sync(context.Background(), nil, deadletter.SyncConfig{DestinationBaseURL: "hooks.example.com"})
	configchecktest.RequireFields(t, err, "dlq sync", "DLQ", "DestinationBaseURL")
}

// TestSyncAPIErrors: a QStash error stops the sync with an error naming the answer, and
// nothing is recorded from a page that could not be read.
func TestSyncAPIErrors(t *testing.T) {
	t.Parallel()
	qs := qstashtest.NewServer(qstashtest.Options{})
	t.Cleanup(qs.Close)
	_, err := deadletter.Sync(context.Background(), nil, deadletter.SyncConfig{
		DLQ: serverDLQ(t, qs, "wrong"), DestinationBaseURL: "https://hooks.example.com", Logger: quiet()})
	var apiErr *qstash.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || !strings.Contains(err.Error(), "invalid token") {
		t.Fatalf("err = %v", err)
	}
}

// loopingDLQ injects a DLQ API that hands out the same cursor forever.
type loopingDLQ struct{ calls int }

func (l *loopingDLQ) List(context.Context, string) ([]qstash.DLQEntry, string, error) {
	l.calls++
	return []qstash.DLQEntry{{DLQID: "d", MessageID: "m", URL: "https://elsewhere.example.com/x"}}, "same", nil
}

func (l *loopingDLQ) Delete(context.Context, []string) (int, error) { return 0, nil }

func TestSyncStopsOnRepeatedCursor(t *testing.T) {
	t.Parallel()
	dlq := &loopingDLQ{}
	res, err := deadletter.Sync(context.Background(), nil, deadletter.SyncConfig{DLQ: dlq, DestinationBaseURL: "https://hooks.example.com", Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), `cursor "same" again`) || dlq.calls != 2 || res.Foreign != 2 {
		t.Fatalf("res %+v calls %d err %v", res, dlq.calls, err)
	}
}
