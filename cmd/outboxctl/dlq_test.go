package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

func runCLI(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	return runCLIEnv(t, map[string]string{"DATABASE_URL": url}, args...)
}

// runCLIEnv runs outboxctl with exactly the environment vars.
func runCLIEnv(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := env{stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}
	code := run(context.Background(), e, args)
	return code, out.String(), errb.String()
}

// seedLetter enqueues an event, marks it dispatched and records a delivery failure for it.
func seedLetter(t *testing.T, db *pgtest.DB, topic, key, msgID string) (letterID, outboxID int64) {
	t.Helper()
	ctx := context.Background()
	id, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: topic, PartitionKey: key, Payload: json.RawMessage(`{"order_id":"o-1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox SET dispatched_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	r, err := deadletter.Record(ctx, db.Pool, deadletter.DeliveryFailure{
		QStashMessageID: msgID, Status: 489, MaxRetries: 3, ResponseBody: []byte(`{"error":"rejected"}`),
		OutboxID: id, SourceBody: []byte(`{"order_id":"o-1"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r.LetterID, int64(id)
}

func TestDLQListShowRedrive(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	l1, o1 := seedLetter(t, db, "order.created", "order:1", "m1")
	l2, _ := seedLetter(t, db, "invoice.paid", "order:2", "m2")
	s1, s2 := strconv.FormatInt(l1, 10), strconv.FormatInt(l2, 10)

	code, out, stderr := runCLI(t, db.URL, "dlq", "list")
	if code != 0 || !strings.Contains(out, "order.created") || !strings.Contains(out, "invoice.paid") || !strings.Contains(out, "HTTP 489") {
		t.Fatalf("list: code %d\n%s%s", code, out, stderr)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list", "--topic", "invoice.paid", "--json")
	var letters []deadletter.Letter
	if code != 0 || json.Unmarshal([]byte(out), &letters) != nil || len(letters) != 1 || letters[0].ID != l2 {
		t.Fatalf("list --topic --json: code %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list", "--since", time.Now().Add(time.Hour).Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "no dead letters") {
		t.Fatalf("list --since future: %d %s", code, out)
	}

	code, out, _ = runCLI(t, db.URL, "dlq", "show", s1)
	if code != 0 || !strings.Contains(out, `"order_id": "o-1"`) || !strings.Contains(out, "partition key:   order:1") {
		t.Fatalf("show: %d\n%s", code, out)
	}
	if code, _, stderr = runCLI(t, db.URL, "dlq", "show", "999999"); code != 1 || !strings.Contains(stderr, "does not exist") {
		t.Fatalf("show unknown: %d %s", code, stderr)
	}

	// Refuses to redrive without a selection.
	if code, _, stderr = runCLI(t, db.URL, "dlq", "redrive"); code != 2 || !strings.Contains(stderr, "--all") {
		t.Fatalf("redrive without selection: %d %s", code, stderr)
	}
	// Dry run: says what it would do, changes nothing. Flags after ids work.
	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", s1, "--dry-run")
	if code != 0 || !strings.Contains(out, "would reset outbox row") {
		t.Fatalf("dry run: %d %s", code, out)
	}
	var gen int
	if err := db.Pool.QueryRow(context.Background(), `SELECT generation FROM outbox WHERE id = $1`, o1).Scan(&gen); err != nil || gen != 0 {
		t.Fatalf("dry run changed the row: generation %d %v", gen, err)
	}

	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", s1)
	if code != 0 || !strings.Contains(out, "reset to pending (generation 1)") {
		t.Fatalf("redrive: %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", s1)
	if code != 0 || !strings.Contains(out, "letter "+s1+": already resolved, nothing to do") {
		t.Fatalf("redrive again: %d %s", code, out)
	}
	// Missing ids make the exit status 1 but do not stop the rest.
	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", "--json", s2, "999999")
	var res deadletter.RedriveResult
	if code != 1 || json.Unmarshal([]byte(out), &res) != nil || len(res.Redriven) != 1 || len(res.NotFound) != 1 {
		t.Fatalf("redrive with unknown id: %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list")
	if code != 0 || !strings.Contains(out, "no dead letters") {
		t.Fatalf("list after redrive: %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list", "--all")
	if code != 0 || strings.Count(out, "(redriven)") != 2 {
		t.Fatalf("list --all: %d %s", code, out)
	}
}

func TestDLQArgumentErrors(t *testing.T) {
	t.Parallel()
	// Each argument error exits 2 before touching the database, and says what was wrong:
	// the flag it names, or what was expected.
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"dlq"}, "expected list, show, redrive, sync"},
		{[]string{"dlq", "frob"}, `unknown dlq command "frob"`},
		{[]string{"dlq", "show"}, "expected one dead letter id, or --group FP"},
		{[]string{"dlq", "show", "x"}, `"x" is not a dead letter id`},
		{[]string{"dlq", "redrive", "abc"}, `"abc" is not a dead letter id`},
		{[]string{"dlq", "list", "--since", "yesterday"}, "--since"},
		{[]string{"dlq", "list", "7"}, "unexpected arguments"},
		{[]string{"dlq", "list", "--limit", "x"}, "-limit"},
		{[]string{"dlq", "list", "--bogus"}, "-bogus"},
		{[]string{"dlq", "redrive", "--group", "xyz"}, "--group"},
		{[]string{"dlq", "redrive", "--group", "0123456789ABCDEF"}, "--group"},
		{[]string{"dlq", "redrive", "--group"}, "-group"},
		{[]string{"dlq", "redrive", "--until", "soon", "--group", "0123456789abcdef"}, "--until"},
		{[]string{"dlq", "show", "--group", "0123456789abcdef", "5"}, "--group"},
		{[]string{"dlq", "show", "--group", "12"}, "--group"},
		{[]string{"dlq", "list", "--group=maybe"}, "-group"},
		{[]string{"dlq", "sync", "--bogus"}, "-bogus"},
		{[]string{"dlq", "sync", "now"}, "unexpected arguments"},
		{[]string{"dlq", "sync"}, "QSTASH_TOKEN (or QSTASH_TOKEN_PARAM) is not set"},
		{[]string{"dlq", "sync"}, "PUBLIC_BASE_URL is not set"},
	} {
		code, _, stderr := runCLI(t, "postgres://unused", c.args...)
		if code != 2 || !strings.Contains(stderr, c.says) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.says)
		}
	}
}

func TestDLQGroups(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	var outboxIDs []int64
	for _, m := range []string{"m1", "m2", "m3"} {
		_, o := seedLetter(t, db, "order.created", "order:"+m, m)
		outboxIDs = append(outboxIDs, o)
	}
	other, _ := seedLetter(t, db, "invoice.paid", "order:9", "m9")

	code, out, stderr := runCLI(t, db.URL, "dlq", "list", "--group", "--json")
	var groups []deadletter.Group
	if code != 0 || json.Unmarshal([]byte(out), &groups) != nil || len(groups) != 2 {
		t.Fatalf("list --group --json: %d %s %s", code, out, stderr)
	}
	g := groups[0] // largest first
	if g.Topic != "order.created" || g.Count != 3 || g.StatusCode != 489 || g.ErrorPattern != "qstash delivery failed: HTTP <n> after <n> of <n> retries" {
		t.Fatalf("group %+v", g)
	}
	fp := g.Fingerprint

	code, out, _ = runCLI(t, db.URL, "dlq", "list", "--group")
	if code != 0 || !strings.Contains(out, fp+"  3 ") || !strings.Contains(out, groups[1].Fingerprint) || !strings.Contains(out, "dlq show --group") {
		t.Fatalf("list --group: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "show", "--group", fp)
	if code != 0 || !strings.Contains(out, "letters:         3 (3 open)") || !strings.Contains(out, "error pattern:   qstash delivery failed: HTTP <n>") ||
		!strings.Contains(out, "order:m2") || strings.Contains(out, "order:9") {
		t.Fatalf("show --group: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "show", "--json", "--group", fp, "--limit", "2")
	var view struct {
		Group   deadletter.Group    `json:"group"`
		Letters []deadletter.Letter `json:"letters"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &view) != nil || view.Group.Count != 3 || len(view.Letters) != 2 || view.Letters[0].Fingerprint != fp {
		t.Fatalf("show --group --json --limit 2: %d %s", code, out)
	}
	// A letter shows its group.
	if code, out, _ = runCLI(t, db.URL, "dlq", "show", strconv.FormatInt(view.Letters[0].ID, 10)); code != 0 || !strings.Contains(out, "group:           "+fp) {
		t.Fatalf("show letter: %d %s", code, out)
	}

	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", "--group", fp, "--dry-run")
	if code != 0 || strings.Count(out, "would reset outbox row") != 3 || !strings.Contains(out, "would redrive 3 letter(s)") {
		t.Fatalf("redrive --group --dry-run: %d %s", code, out)
	}
	if n := countRows(t, db, `generation > 0`); n != 0 {
		t.Fatalf("dry run reset %d rows", n)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "redrive", "--group", fp, "--json")
	var res deadletter.RedriveResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Redriven) != 3 {
		t.Fatalf("redrive --group: %d %s", code, out)
	}
	for _, r := range res.Redriven {
		if !slices.Contains(outboxIDs, int64(r.OutboxID)) || r.Generation != 1 {
			t.Fatalf("redrove %+v, want only rows %v", r, outboxIDs)
		}
	}
	if l, err := deadletter.Get(ctx, db.Pool, other); err != nil || l.Resolved() {
		t.Fatalf("the other group's letter: %+v %v", l, err)
	}
	// The hint names the current flag, not its deprecated spelling --all.
	if code, _, stderr = runCLI(t, db.URL, "dlq", "show", "--group", fp); code != 1 || !strings.Contains(stderr, "--include-resolved") || strings.Contains(stderr, "--all") {
		t.Fatalf("show redriven group: %d %s", code, stderr)
	}
	if code, out, _ = runCLI(t, db.URL, "dlq", "show", "--group", fp, "--all"); code != 0 || !strings.Contains(out, "3 (0 open)") {
		t.Fatalf("show --all redriven group: %d %s", code, out)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list", "--group")
	if code != 0 || strings.Contains(out, fp) || !strings.Contains(out, groups[1].Fingerprint) {
		t.Fatalf("list --group after redrive: %d %s", code, out)
	}
}

func TestParseTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"2030-04-01T00:00:00Z": time.Date(2030, 4, 1, 0, 0, 0, 0, time.UTC),
		"2030-04-02":           time.Date(2030, 4, 2, 0, 0, 0, 0, time.UTC),
		"90m":                  now.Add(-90 * time.Minute),
	} {
		got, err := parseTime(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseTime("-5m", now); err == nil {
		t.Error("negative duration accepted")
	}
}

// waitDLQ waits until qs has finished every delivery, then checks its DLQ holds n entries.
func waitDLQ(t *testing.T, qs *qstashtest.Server, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := qs.WaitIdle(ctx); err != nil || len(qs.DLQ()) != n {
		t.Fatalf("QStash DLQ: %d entries, want %d (%v)", len(qs.DLQ()), n, err)
	}
}

func TestDLQSync(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})
	// The webhook rejects the event (489 + Upstash-NonRetryable-Error): a dead letter. A 5xx
	// would be an outage, which dlq sync reschedules (pkg/deadletter TestSyncReschedulesOutage).
	webhook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Upstash-NonRetryable-Error", "true")
		w.WriteHeader(489)
	}))
	t.Cleanup(webhook.Close)
	vars := map[string]string{"DATABASE_URL": db.URL, "QSTASH_URL": qs.URL, "QSTASH_TOKEN": qs.Token, "PUBLIC_BASE_URL": webhook.URL}

	// One event delivered to a webhook that rejects it, with no failure callback configured:
	// the dead letter exists only in QStash's DLQ.
	id, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "order:1", Payload: json.RawMessage(`{"order_id":"o-1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: webhook.URL, Retries: qstash.NoRetries})
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Publish(ctx, []outbox.Message{{ID: id, Topic: "order.created", PartitionKey: "order:1", Payload: []byte(`{"order_id":"o-1"}`), Attempt: 1}}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	waitDLQ(t, qs, 1)

	code, out, stderr := runCLIEnv(t, vars, "dlq", "sync")
	if code != 0 || !strings.Contains(out, "read 1 QStash DLQ entries in 1 page(s): 1 recorded as new dead letters") || !strings.Contains(out, "dlq list --group") {
		t.Fatalf("dlq sync: %d\n%s%s", code, out, stderr)
	}
	code, out, _ = runCLI(t, db.URL, "dlq", "list")
	if code != 0 || !strings.Contains(out, "order.created") || !strings.Contains(out, "HTTP 489") {
		t.Fatalf("list after sync: %d %s", code, out)
	}
	code, out, stderr = runCLIEnv(t, vars, "dlq", "sync", "--delete-synced", "--json")
	var res deadletter.SyncResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Recorded != 0 || res.AlreadyRecorded != 1 || res.Deleted != 1 {
		t.Fatalf("dlq sync --delete-synced --json: %d %s %s", code, out, stderr)
	}
	golden(t, "dlq_sync", out, volatile)
	if n := len(qs.DLQ()); n != 0 {
		t.Fatalf("%d entries left in QStash", n)
	}
	// A QStash that refuses the token: a runtime failure (exit 3), the answer named.
	vars["QSTASH_TOKEN"] = "wrong"
	if code, _, stderr = runCLIEnv(t, vars, "dlq", "sync"); code != 3 || !strings.Contains(stderr, "401") {
		t.Fatalf("wrong token: %d %s", code, stderr)
	}
}
