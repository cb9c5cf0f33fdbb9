package console_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/console"
	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/localstack"
	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// ChromiumPath is Debian's chromium package, which .ci/run installs.
const chromiumPath = "/usr/bin/chromium"

var updateDocs = flag.Bool("update-docs", false, "write the overview screenshot of the browser test to docs/console.png, "+
	"after adding three hours of history (docsHistory) so the chart has something to show")

// docsHistory adds three hours of dispatched traffic (about 100 events a minute, varying)
// with a 25-minute relay outage 100 to 75 minutes ago, drained at once when it ended: the
// backlog and the oldest age climb, then fall. Only for the README's picture; the test's
// assertions do not depend on it.
const docsHistory = `
INSERT INTO outbox (topic, partition_key, payload, created_at, available_at, dispatched_at, attempts)
SELECT 'order.created', 'customer-' || (g % 50), jsonb_build_object('order_id', 'h-' || g, 'amount_cents', 1200, 'currency', 'EUR'),
       t, t,
       CASE WHEN t >= now() - interval '100 minutes' AND t < now() - interval '75 minutes'
            THEN now() - interval '75 minutes' + (g % 900) * interval '60 ms'
            ELSE t + interval '45 ms' END,
       1
FROM generate_series(1, 18000) g,
     LATERAL (SELECT g / 18000.0 AS x) x,
     LATERAL (SELECT now() - interval '3 hours' + interval '3 hours' * (x.x + 0.3 * sin(12 * pi() * x.x) / (12 * pi())) AS t) c
WHERE c.t < now() - interval '1 minute'`

// screenshotDir is where the browser test writes its screenshots: $ARTIFACTS_DIR/screenshots
// when CI sets it, else tmp/screenshots at the module root (ignored by git).
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(moduleRoot(t), "tmp", "screenshots")
	if a := os.Getenv("ARTIFACTS_DIR"); a != "" {
		dir = filepath.Join(a, "screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("create screenshot dir: %v", err)
	}
	return dir
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// pipelineDeadLetters runs real events through the local pipeline (relay, built-in QStash,
// webhook with the order.created handler, failure callback): good orders are charged, the
// poison ones are rejected as permanent and come back as delivery dead letters through
// QStash's failure callback. It returns the poison events' ids once both are recorded.
func pipelineDeadLetters(t *testing.T, db *pgtest.DB, good, poison int) []outbox.ID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pl, err := localstack.StartPipeline(ctx, localstack.PipelineConfig{
		Pool:     db.Pool,
		Handlers: webhook.Handlers{"order.created": orders.OrderCreated},
		QStash:   qstashtest.Options{TimeScale: 0.0001},
	})
	if err != nil {
		t.Fatalf("start pipeline: %v", err)
	}
	defer pl.Close()
	var evs []outbox.Event
	for i := range good + poison {
		amount := 1500 + i
		if i >= good {
			amount = 0 // the handler rejects it: a permanent error, a dead letter
		}
		p, _ := json.Marshal(map[string]any{"order_id": fmt.Sprintf("ord-%d", i), "amount_cents": amount, "currency": "EUR"})
		evs = append(evs, outbox.Event{Topic: "order.created", PartitionKey: fmt.Sprintf("customer-%d", i), Payload: p,
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}})
	}
	ids := enqueue(t, db, evs)
	r, err := pl.NewRelay(db.Pool, relay.Config{BatchSize: 50})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := r.Drain(ctx); err != nil {
			t.Fatalf("relay drain: %v", err)
		}
		var charged, dead int
		err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM billing_charges), (SELECT count(*) FROM dead_letters WHERE source = 'delivery')`).Scan(&charged, &dead)
		if err != nil {
			t.Fatal(err)
		}
		if charged == good && dead == poison {
			return ids[good:]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pipeline did not settle: %d charged of %d, %d dead letters of %d", charged, good, dead, poison)
		case <-time.After(50 * time.Millisecond): // the next relay tick
		}
	}
}

// TestBrowserFindsAndRedrivesADeadLetter drives headless Chromium through the console: the
// overview with its chart, a dead letter found through its failure group and a filter, redriven from the page (dry run,
// then confirm, with the CSRF flow), and the database shows its event pending again with a
// new generation.
func TestBrowserFindsAndRedrivesADeadLetter(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		prereq.Missing(t, "browser test needs Debian's chromium at %s (apt-get install -y chromium): %v", chromiumPath, err)
	}
	t.Parallel()
	db := pgtest.New(t)
	if err := orders.Migrate(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	poison := pipelineDeadLetters(t, db, 6, 2)
	target := poison[1]
	var key string
	if err := db.Pool.QueryRow(context.Background(), `SELECT partition_key FROM outbox WHERE id = $1`, int64(target)).Scan(&key); err != nil {
		t.Fatal(err)
	}
	before := stateOf(t, db, target)
	if before.Pending || before.OpenLetters != 1 {
		t.Fatalf("fixture: %+v", before)
	}
	if *updateDocs {
		if _, err := db.Pool.Exec(context.Background(), docsHistory); err != nil {
			t.Fatalf("docs history: %v", err)
		}
	}
	ts := start(t, db, console.Config{AllowRedrive: true})
	shots := screenshotDir(t)

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	defer cancelBrowser()
	// The first action starts the browser, on a context without a deadline (a deadline
	// there would bound the browser's life); every later step has one.
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()

	do := func(step string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(v)
	}
	attr := func(sel, name string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(sel), name))
		if err != nil {
			t.Fatalf("attribute %s of %s: %v", name, sel, err)
		}
		return v.Value
	}
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
		if err != nil {
			t.Fatalf("count %s: %v", sel, err)
		}
		return n
	}
	shot := func(name string) string {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		path := filepath.Join(shots, name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s", path)
		return path
	}

	// Overview: the chart is an svg with three series of data points.
	do("overview", chromedp.Navigate(ts.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#overview-chart`)))
	buckets, pendingPoints := attr(`#overview-chart`, "data-buckets"), attr(`g[data-series="pending"]`, "data-points")
	if polygons := count(`#overview-chart polygon.area`); buckets != "180" || pendingPoints != "180" || polygons != 3 {
		t.Fatalf("chart: %s buckets, %s pending points, %d series drawn", buckets, pendingPoints, polygons)
	}
	if m, _ := strconv.ParseFloat(attr(`g[data-series="dispatched"]`, "data-max"), 64); m < 1 {
		t.Fatalf("chart shows no dispatches (max %v) after 8 events went through", m)
	}
	if dead := text(`#fig-dead`); dead != "2" {
		t.Fatalf("overview shows %q open dead letters, want 2", dead)
	}
	overview := shot("01-overview")
	if *updateDocs {
		b, err := os.ReadFile(overview)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(moduleRoot(t), "docs", "console.png"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Dead letters: the failure groups list one group (both poison events failed alike);
	// its link lists its two letters, and the key narrows them to the target.
	want := letterIDsOf(t, db, []outbox.ID{target})[0]
	var fp string
	if err := db.Pool.QueryRow(context.Background(), `SELECT fingerprint FROM dead_letters WHERE id = $1`, want).Scan(&fp); err != nil {
		t.Fatal(err)
	}
	do("failure groups",
		chromedp.Navigate(ts.URL+"/dead-letters"),
		chromedp.WaitVisible(chromedp.CSS(`#tab-groups`)),
		chromedp.Click(chromedp.CSS(`#tab-groups`)),
		chromedp.WaitVisible(chromedp.CSS(`#groups`)),
	)
	if rows, group := count(`#groups tbody tr`), attr(`#groups tbody tr`, "data-group"); rows != 1 || group != fp {
		t.Fatalf("groups page: %d groups, first %s; want group %s only", rows, group, fp)
	}
	shot("02-failure-groups")
	do("open the group",
		chromedp.Click(chromedp.CSS(`#groups a.group-link`)),
		chromedp.WaitVisible(chromedp.CSS(`#group-`+fp)),
		chromedp.WaitVisible(chromedp.CSS(`#letters`)),
	)
	if rows := count(`#letters tbody tr`); rows != 2 || count(fmt.Sprintf(`#letters tr[data-letter-id="%d"]`, want)) != 1 {
		t.Fatalf("group %s lists %d letters; want the 2 poison letters, letter %d among them", fp, rows, want)
	}
	do("narrow the group by key",
		chromedp.SendKeys(chromedp.CSS(`#filters input[name="key"]`), key),
		chromedp.Click(chromedp.CSS(`#apply-filter`)),
		chromedp.WaitVisible(chromedp.CSS(`#letters tbody tr:only-child`)),
	)
	if rows, first := count(`#letters tbody tr`), attr(`#letters tbody tr`, "data-letter-id"); rows != 1 || first != strconv.FormatInt(want, 10) {
		t.Fatalf("group %s and key %s: %d rows, first %s; want letter %d only", fp, key, rows, first, want)
	}
	if g := attr(`#filters input[name="group"]`, "value"); g != fp {
		t.Fatalf("the filter form lost the group: %q", g)
	}
	shot("02-dead-letters-filtered")

	// Redrive it from the page: select, dry run, confirm.
	do("dry run",
		chromedp.Click(chromedp.CSS(`#letters input.pick`)),
		chromedp.Click(chromedp.CSS(`#redrive-selected`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm-redrive`)),
	)
	if n := text(`#redrive-count`); n != "1" {
		t.Fatalf("dry run counts %q letters", n)
	}
	shot("03-redrive-dry-run")
	if s := stateOf(t, db, target); s.Pending || s.Generation != before.Generation {
		t.Fatalf("the dry run changed the row: %+v", s)
	}
	do("confirm redrive",
		chromedp.Click(chromedp.CSS(`#confirm-redrive`)),
		chromedp.WaitVisible(chromedp.CSS(`#redrive-summary[data-dry-run="false"]`)),
	)
	if n, g := text(`#redrive-count`), text(`.generation`); n != "1" || g != strconv.Itoa(before.Generation+1) {
		t.Fatalf("page says %q redriven at generation %q", n, g)
	}
	shot("04-redrive-done")
	after := stateOf(t, db, target)
	if !after.Pending || after.Generation != before.Generation+1 || after.Attempts != 0 || after.OpenLetters != 0 || after.RedrivenOnes != 1 {
		t.Fatalf("database after the redrive: %+v (before %+v)", after, before)
	}
	// The other poison letter is untouched.
	if s := stateOf(t, db, poison[0]); s.Pending || s.OpenLetters != 1 {
		t.Fatalf("the other letter changed: %+v", s)
	}

	// The event page shows the new state and the trace id.
	do("event page", chromedp.Navigate(fmt.Sprintf("%s/events?id=%d", ts.URL, target)), chromedp.WaitVisible(chromedp.CSS(`#event-state`)))
	if st, tr := text(`#event-state`), text(`#trace-id`); st != "pending" || tr != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("event page: state %q, trace %q", st, tr)
	}
	shot("05-event")
}
