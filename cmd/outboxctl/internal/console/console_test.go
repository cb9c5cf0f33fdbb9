package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/console"
	"github.com/outbox-relay/outbox-relay/v3/internal/health"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/inbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

func TestOverviewShowsStatusFiguresChartAndDeadLetterGroups(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	enqueue(t, db, events("order.created", "k1", 4, nil))
	settle(t, db, false, "", nil) // 4 dispatched
	enqueue(t, db, events("order.created", "k2", 2, nil))
	settle(t, db, true, "handler said no", nil) // 2 dead letters
	enqueue(t, db, events("order.created", "k3", 3, nil))
	ts := start(t, db, console.Config{})

	resp, err := http.Get(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET / = %d", resp.StatusCode)
	}
	h := resp.Header
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	if h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Cache-Control") != "no-store" {
		t.Errorf("security headers: %v", h)
	}

	_, body := get(t, http.DefaultClient, ts.URL, "/")
	// The figures are health.Collect's, the code behind outboxctl status.
	rep, err := health.Collect(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, body,
		fmt.Sprintf(`id="fig-pending">%d<`, rep.Queue.Pending),
		fmt.Sprintf(`id="fig-dead">%d<`, rep.DeadLettersUnresolved),
		`<svg xmlns="http://www.w3.org/2000/svg" class="chart"`, `data-buckets="180"`,
		`data-series="pending" data-points="180" data-max="3"`,
		`data-series="dispatched" data-points="180"`,
		`<td>relay</td><td><a href="/dead-letters?source=relay&amp;topic=order.created">order.created</a></td><td class="num">2</td>`,
	)
	if rep.Queue.Pending != 3 || rep.DeadLettersUnresolved != 2 {
		t.Fatalf("fixture: pending %d, dead letters %d", rep.Queue.Pending, rep.DeadLettersUnresolved)
	}
	// The status verdict is Check's: two open dead letters make it degraded.
	mustContain(t, body, `id="status">DEGRADED<`, "2 unresolved dead letters")

	// Other windows; an unknown one falls back to the default.
	_, body = get(t, http.DefaultClient, ts.URL, "/?range=24h")
	mustContain(t, body, `data-buckets="144"`, `data-bucket-seconds="600"`)
	_, body = get(t, http.DefaultClient, ts.URL, "/?range=';drop")
	mustContain(t, body, `data-buckets="180"`)
}

func TestOverviewWarnsOfTheXminHorizon(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// A transaction that holds a snapshot: its age crosses a 1 ns threshold at once.
	tx, err := db.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var xid int64
	if err := tx.QueryRow(context.Background(), `SELECT txid_current()`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	warn := start(t, db, console.Config{Thresholds: health.Thresholds{MaxTransactionAge: time.Nanosecond}})
	_, body := get(t, http.DefaultClient, warn.URL, "/")
	mustContain(t, body, `id="horizon-warning"`, "VACUUM is held back")

	off := start(t, db, console.Config{Thresholds: health.Thresholds{MaxTransactionAge: -1, MaxXminAge: -1, MaxOldestPendingAge: -1}})
	_, body = get(t, http.DefaultClient, off.URL, "/")
	mustNotContain(t, body, `id="horizon-warning"`)
}

var letterRowRE = regexp.MustCompile(`data-letter-id="(\d+)"`)

func letterIDsOnPage(body string) []int64 {
	var ids []int64
	for _, m := range letterRowRE.FindAllStringSubmatch(body, -1) {
		id, _ := strconv.ParseInt(m[1], 10, 64)
		ids = append(ids, id)
	}
	return ids
}

// walkLetterPages follows the dead-letter list's next-page links from /dead-letters?q,
// calling visit with each page's number (from 0) and body. It fails the test on a status
// other than 200, or when the links go on past page 4.
func walkLetterPages(t *testing.T, base, q string, visit func(page int, body string)) {
	t.Helper()
	for page := 0; ; page++ {
		code, body := get(t, http.DefaultClient, base, "/dead-letters?"+q)
		if code != http.StatusOK {
			t.Fatalf("page %d of %s: %d", page, q, code)
		}
		visit(page, body)
		m := nextRE.FindStringSubmatch(body)
		if m == nil {
			return
		}
		if page > 3 {
			t.Fatal("pagination does not end")
		}
		q = strings.ReplaceAll(m[1], "&amp;", "&")
	}
}

var nextRE = regexp.MustCompile(`href="/dead-letters\?([^"]+)" id="next-page"`)

func TestLettersFilterAndKeysetPagination(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// Seven letters of topic a written by one statement: they share created_at, so the
	// pages must break the tie on id.
	aIDs := enqueue(t, db, events("topic.a", "k1", 7, nil))
	settle(t, db, true, "bad a", nil)
	enqueue(t, db, events("topic.b", "k2", 3, nil))
	settle(t, db, true, "bad b", nil)
	want := letterIDsOf(t, db, aIDs)
	ts := start(t, db, console.Config{PageSize: 3})
	c := http.DefaultClient

	var seen []int64
	walkLetterPages(t, ts.URL, "topic=topic.a", func(page int, body string) {
		ids := letterIDsOnPage(body)
		if page < 2 && len(ids) != 3 || page == 2 && len(ids) != 1 {
			t.Fatalf("page %d has %d letters: %v", page, len(ids), ids)
		}
		seen = append(seen, ids...)
	})
	// Newest first: the same created_at, so id descending; every letter exactly once.
	if len(seen) != len(want) {
		t.Fatalf("saw %v, want the %d letters %v", seen, len(want), want)
	}
	for i := range seen {
		if seen[i] != want[len(want)-1-i] {
			t.Fatalf("saw %v, want %v reversed", seen, want)
		}
	}

	// Other filters: key, source, time range, resolved.
	_, body := get(t, c, ts.URL, "/dead-letters?key=k2&limit=50")
	if n := len(letterIDsOnPage(body)); n != 3 {
		t.Errorf("key=k2: %d letters", n)
	}
	_, body = get(t, c, ts.URL, "/dead-letters?source=delivery")
	mustContain(t, body, `id="no-letters"`)
	_, body = get(t, c, ts.URL, "/dead-letters?since=2000-01-01&until=2000-01-02")
	mustContain(t, body, `id="no-letters"`)
	_, body = get(t, c, ts.URL, "/dead-letters?since=1h&limit=50")
	if n := len(letterIDsOnPage(body)); n != 10 {
		t.Errorf("since=1h: %d letters", n)
	}
}

func TestLetterFiltersAreParametersNotSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	enqueue(t, db, events("topic.a", "k1", 2, nil))
	settle(t, db, true, "bad", nil)
	ts := start(t, db, console.Config{AllowRedrive: true})
	evil := `'; drop table outbox; --`
	for _, field := range []string{"topic", "key", "source"} {
		code, body := get(t, http.DefaultClient, ts.URL, "/dead-letters?"+url.Values{field: {evil}}.Encode())
		if code != http.StatusOK {
			t.Fatalf("%s=%q: %d", field, evil, code)
		}
		mustContain(t, body, `id="no-letters"`)
		// Echoed back escaped, never as markup.
		mustNotContain(t, body, `value="'; drop`)
	}
	// A redrive by that filter matches nothing either.
	c, tok := session(t, ts.URL, "/dead-letters")
	code, body, _ := post(t, c, ts.URL, "/dead-letters/redrive", url.Values{"csrf_token": {tok}, "scope": {"filter"}, "topic": {evil}, "confirm": {"1"}}, nil)
	if code != http.StatusOK {
		t.Fatalf("redrive by evil filter: %d", code)
	}
	mustContain(t, body, `id="redrive-empty"`)
	code, _ = get(t, http.DefaultClient, ts.URL, "/events?id="+url.QueryEscape("1; drop table outbox"))
	if code != http.StatusBadRequest {
		t.Fatalf("event id with SQL: %d, want 400", code)
	}
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("outbox after the attempts: %d rows, %v", n, err)
	}
	if s := stateOf(t, db, 1); s.OpenLetters != 1 || s.Generation != 0 {
		t.Fatalf("letter changed: %+v", s)
	}
}

func TestLettersRejectMalformedInput(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ts := start(t, db, console.Config{})
	for _, q := range []string{"since=yesterday", "until=13/2024", "after=abc", "after=5.-1", "limit=0", "limit=100000"} {
		code, body := get(t, http.DefaultClient, ts.URL, "/dead-letters?"+q)
		if code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", q, code)
		}
		mustContain(t, body, `class="error"`)
	}
	for _, p := range []string{"/dead-letters/x", "/dead-letters/-3", "/dead-letters/0"} {
		if code, _ := get(t, http.DefaultClient, ts.URL, p); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", p, code)
		}
	}
	if code, _ := get(t, http.DefaultClient, ts.URL, "/dead-letters/999999"); code != http.StatusNotFound {
		t.Errorf("unknown letter: %d, want 404", code)
	}
}

func TestLetterDetailShowsEverythingDLQShowDoes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ids := enqueue(t, db, events("order.created", "cust-9", 1, map[string]string{"traceparent": tp, "X-Request-Id": "req-42"}))
	settle(t, db, true, "amount must be positive", nil)
	letter := letterIDsOf(t, db, ids)[0]
	ts := start(t, db, console.Config{AllowRedrive: true})

	code, body := get(t, http.DefaultClient, ts.URL, fmt.Sprintf("/dead-letters/%d", letter))
	if code != http.StatusOK {
		t.Fatalf("detail: %d", code)
	}
	mustContain(t, body, "order.created", "cust-9", fmt.Sprintf("amount must be positive (event %d)", ids[0]),
		"<tr><th>status code</th><td>400</td></tr>", "<tr><th>attempts</th><td>1</td></tr>",
		`<code id="trace-id">4bf92f3577b34da6a3ce929d0e0e4736</code>`, "X-Request-Id", "req-42",
		`&#34;topic&#34;: &#34;order.created&#34;`, `id="redrive-one"`, fmt.Sprintf(`href="/events?id=%d"`, ids[0]))

	ro := start(t, db, console.Config{})
	_, body = get(t, http.DefaultClient, ro.URL, fmt.Sprintf("/dead-letters/%d", letter))
	mustNotContain(t, body, `id="redrive-one"`)
	_, body = get(t, http.DefaultClient, ro.URL, "/dead-letters")
	mustNotContain(t, body, `id="redrive-selection"`, `id="redrive-filter"`, `class="pick"`)
}

func TestEventPageShowsRowDedupeLettersAndTrace(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ids := enqueue(t, db, events("order.created", "k", 1, map[string]string{"traceparent": tp}))
	settle(t, db, true, "first try failed", nil)
	letter := letterIDsOf(t, db, ids)[0]
	if _, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{IDs: []int64{letter}}, nil); err != nil {
		t.Fatal(err)
	}
	settle(t, db, false, "", nil)
	// The consumer's dedupe record, written by the consumer's own code path.
	if _, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "orders", ID: ids[0].String(), PayloadHash: []byte{0xab, 0xcd}}, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ts := start(t, db, console.Config{})

	code, body := get(t, http.DefaultClient, ts.URL, fmt.Sprintf("/events?id=%d", ids[0]))
	if code != http.StatusOK {
		t.Fatalf("event: %d", code)
	}
	mustContain(t, body, `id="event-state">dispatched<`, `<td id="event-generation">1</td>`,
		fmt.Sprintf("<code>outbox-%d-r1</code>", ids[0]), `<code id="trace-id">0af7651916cd43dd8448eb211c80319c</code>`,
		"<td>orders</td>", "<code>abcd</code>", fmt.Sprintf(`href="/dead-letters/%d"`, letter), "(redriven)")

	code, body = get(t, http.DefaultClient, ts.URL, "/events?id=424242")
	if code != http.StatusNotFound {
		t.Errorf("unknown event: %d, want 404", code)
	}
	mustContain(t, body, `id="event-missing"`, `id="no-dedupe"`)
	if code, _ := get(t, http.DefaultClient, ts.URL, "/events?id=abc"); code != http.StatusBadRequest {
		t.Errorf("bad id: %d", code)
	}
	if code, body := get(t, http.DefaultClient, ts.URL, "/events"); code != http.StatusOK || !strings.Contains(body, "Event lookup") {
		t.Errorf("lookup form: %d", code)
	}
}

// deadFixture makes n dead letters of topic t1 (key ka) and m of topic t2 (key kb).
func deadFixture(t *testing.T, n, m int) (*pgtest.DB, []outbox.ID, []outbox.ID) {
	db := pgtest.New(t)
	a := enqueue(t, db, events("t1", "ka", n, nil))
	b := enqueue(t, db, events("t2", "kb", m, nil))
	settle(t, db, true, "rejected", nil)
	return db, a, b
}

func redriveForm(tok string, kv ...string) url.Values {
	v := url.Values{"csrf_token": {tok}}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return v
}

func TestReadOnlyConsoleRefusesEveryAction(t *testing.T) {
	t.Parallel()
	db, a, _ := deadFixture(t, 2, 0)
	letters := letterIDsOf(t, db, a)
	ts := start(t, db, console.Config{}) // no AllowRedrive
	c, tok := session(t, ts.URL, "/dead-letters")
	for _, form := range []url.Values{
		redriveForm(tok, "scope", "ids", "id", strconv.FormatInt(letters[0], 10), "confirm", "1"),
		redriveForm(tok, "scope", "filter", "topic", "t1", "confirm", "1"),
		redriveForm(tok, "scope", "filter", "topic", "t1"), // even the dry run
	} {
		code, _, h := post(t, c, ts.URL, "/dead-letters/redrive", form, nil)
		if code != http.StatusForbidden {
			t.Fatalf("read-only redrive %v: %d, want 403", form, code)
		}
		if h.Get("Cache-Control") != "no-store" {
			t.Errorf("action response Cache-Control = %q", h.Get("Cache-Control"))
		}
	}
	for _, id := range a {
		if s := stateOf(t, db, id); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
			t.Fatalf("row %d changed in read-only mode: %+v", id, s)
		}
	}
}

func TestActionsNeedTheCSRFToken(t *testing.T) {
	t.Parallel()
	db, a, _ := deadFixture(t, 1, 0)
	letter := strconv.FormatInt(letterIDsOf(t, db, a)[0], 10)
	ts := start(t, db, console.Config{AllowRedrive: true})
	c, tok := session(t, ts.URL, "/dead-letters")
	_, otherTok := session(t, ts.URL, "/dead-letters") // valid, but for another browser's cookie

	cases := []struct {
		name   string
		client *http.Client
		form   url.Values
		hdr    map[string]string
	}{
		{"no token", c, url.Values{"scope": {"ids"}, "id": {letter}, "confirm": {"1"}}, nil},
		{"wrong token", c, redriveForm("AAAA"+tok[4:], "scope", "ids", "id", letter, "confirm", "1"), nil},
		{"another browser's token", c, redriveForm(otherTok, "scope", "ids", "id", letter, "confirm", "1"), nil},
		{"no cookie", &http.Client{}, redriveForm(tok, "scope", "ids", "id", letter, "confirm", "1"), nil},
		{"cross-site origin", c, redriveForm(tok, "scope", "ids", "id", letter, "confirm", "1"), map[string]string{"Origin": "https://evil.example"}},
		{"opaque origin", c, redriveForm(tok, "scope", "ids", "id", letter, "confirm", "1"), map[string]string{"Origin": "null"}},
	}
	for _, tc := range cases {
		code, _, _ := post(t, tc.client, ts.URL, "/dead-letters/redrive", tc.form, tc.hdr)
		if code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", tc.name, code)
		}
		if s := stateOf(t, db, a[0]); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
			t.Fatalf("%s: the row changed: %+v", tc.name, s)
		}
	}
	// The header form of the token works for scripts, with the cookie.
	code, body, _ := post(t, c, ts.URL, "/dead-letters/redrive", url.Values{"scope": {"ids"}, "id": {letter}}, map[string]string{"X-CSRF-Token": tok})
	if code != http.StatusOK {
		t.Fatalf("dry run with header token: %d %s", code, clip(body))
	}
}

func TestRedriveOneAfterADryRun(t *testing.T) {
	t.Parallel()
	db, a, _ := deadFixture(t, 2, 0)
	letters := letterIDsOf(t, db, a)
	ts := start(t, db, console.Config{AllowRedrive: true})
	c, tok := session(t, ts.URL, fmt.Sprintf("/dead-letters/%d", letters[0]))
	id := strconv.FormatInt(letters[0], 10)

	code, body, _ := post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "ids", "id", id), nil)
	if code != http.StatusOK {
		t.Fatalf("dry run: %d", code)
	}
	mustContain(t, body, `data-dry-run="true"`, `Would redrive <strong id="redrive-count">1</strong>`, `id="confirm-redrive"`,
		`<input type="hidden" name="id" value="`+id+`">`, `<input type="hidden" name="confirm" value="1">`)
	if s := stateOf(t, db, a[0]); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
		t.Fatalf("dry run changed the row: %+v", s)
	}

	code, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "ids", "id", id, "confirm", "1"), nil)
	if code != http.StatusOK {
		t.Fatalf("redrive: %d", code)
	}
	mustContain(t, body, `data-dry-run="false"`, `Redrove <strong id="redrive-count">1</strong>`, `<span class="generation">1</span>`)
	if s := stateOf(t, db, a[0]); !s.Pending || s.Generation != 1 || s.Attempts != 0 || s.OpenLetters != 0 || s.RedrivenOnes != 1 {
		t.Fatalf("after redrive: %+v", s)
	}
	if s := stateOf(t, db, a[1]); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
		t.Fatalf("the other letter's row changed: %+v", s)
	}
	// Again: already resolved, nothing more happens.
	_, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "ids", "id", id, "confirm", "1"), nil)
	mustContain(t, body, fmt.Sprintf("Letter %s: already resolved", id))
	if s := stateOf(t, db, a[0]); s.Generation != 1 {
		t.Fatalf("second redrive bumped again: %+v", s)
	}
}

func TestRedriveSelection(t *testing.T) {
	t.Parallel()
	db, a, _ := deadFixture(t, 4, 0)
	letters := letterIDsOf(t, db, a)
	ts := start(t, db, console.Config{AllowRedrive: true})
	c, tok := session(t, ts.URL, "/dead-letters")
	form := redriveForm(tok, "scope", "ids", "id", strconv.FormatInt(letters[0], 10), "id", strconv.FormatInt(letters[2], 10))
	_, body, _ := post(t, c, ts.URL, "/dead-letters/redrive", form, nil)
	mustContain(t, body, `Would redrive <strong id="redrive-count">2</strong>`)
	form.Set("confirm", "1")
	_, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", form, nil)
	mustContain(t, body, `Redrove <strong id="redrive-count">2</strong>`)
	for i, id := range a {
		s := stateOf(t, db, id)
		picked := i == 0 || i == 2
		if picked != s.Pending || picked != (s.Generation == 1) || picked == (s.OpenLetters == 1) {
			t.Fatalf("row %d (picked %v): %+v", i, picked, s)
		}
	}
	for _, bad := range []url.Values{
		redriveForm(tok, "scope", "ids"),
		redriveForm(tok, "scope", "ids", "id", "1 OR 1=1"),
		redriveForm(tok, "scope", "everything"),
	} {
		if code, _, _ := post(t, c, ts.URL, "/dead-letters/redrive", bad, nil); code != http.StatusBadRequest {
			t.Errorf("%v: %d, want 400", bad, code)
		}
	}
}

func TestRedriveWholeFilterMatchesTheListAndTheDryRun(t *testing.T) {
	t.Parallel()
	db, a, b := deadFixture(t, 5, 3)
	ts := start(t, db, console.Config{AllowRedrive: true})
	c, tok := session(t, ts.URL, "/dead-letters?topic=t1")
	_, list := get(t, c, ts.URL, "/dead-letters?topic=t1&limit=100")
	listed := len(letterIDsOnPage(list))

	_, body, _ := post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "topic", "t1"), nil)
	mustContain(t, body, fmt.Sprintf(`Would redrive <strong id="redrive-count">%d</strong>`, listed),
		`<input type="hidden" name="topic" value="t1">`, `<input type="hidden" name="scope" value="filter">`)
	if listed != 5 {
		t.Fatalf("list shows %d letters of t1", listed)
	}
	_, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "topic", "t1", "confirm", "1"), nil)
	mustContain(t, body, `Redrove <strong id="redrive-count">5</strong>`)
	for _, id := range a {
		if s := stateOf(t, db, id); !s.Pending || s.Generation != 1 || s.OpenLetters != 0 {
			t.Fatalf("t1 row %d: %+v", id, s)
		}
	}
	for _, id := range b {
		if s := stateOf(t, db, id); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
			t.Fatalf("t2 row %d redriven by the t1 filter: %+v", id, s)
		}
	}

	// A filter on source (which deadletter.Filter lacks) is expanded to ids first.
	_, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "source", "delivery", "confirm", "1"), nil)
	mustContain(t, body, `id="redrive-empty"`)
	_, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "source", "relay", "key", "kb"), nil)
	mustContain(t, body, `Would redrive <strong id="redrive-count">3</strong>`)
	_, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "source", "relay", "key", "kb", "confirm", "1"), nil)
	mustContain(t, body, `Redrove <strong id="redrive-count">3</strong>`)
	for _, id := range b {
		if s := stateOf(t, db, id); !s.Pending || s.Generation != 1 || s.OpenLetters != 0 {
			t.Fatalf("t2 row %d: %+v", id, s)
		}
	}
}

func TestRedriveBySourceRefusesMoreThanTheCap(t *testing.T) {
	t.Parallel()
	db, a, _ := deadFixture(t, 3, 0)
	ts := start(t, db, console.Config{AllowRedrive: true, RedriveCap: 2})
	c, tok := session(t, ts.URL, "/dead-letters")
	code, body, _ := post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "source", "relay", "confirm", "1"), nil)
	if code != http.StatusBadRequest {
		t.Fatalf("over the cap: %d", code)
	}
	mustContain(t, body, "More than 2 open letters match")
	if s := stateOf(t, db, a[0]); s.Pending {
		t.Fatal("redriven over the cap")
	}
}

func TestTokenRequiredOffLoopback(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:8089", ":8089", "10.1.2.3:80", "[::]:8089", "console.internal:8089"} {
		if err := console.CheckListen(addr, ""); !errors.Is(err, console.ErrTokenRequired) {
			t.Errorf("CheckListen(%q, no token) = %v", addr, err)
		}
		if err := console.CheckListen(addr, "s3cret"); err != nil {
			t.Errorf("CheckListen(%q, token) = %v", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:8089", "[::1]:0", "localhost:1"} {
		if err := console.CheckListen(addr, ""); err != nil {
			t.Errorf("CheckListen(%q) = %v", addr, err)
		}
	}
	db := pgtest.New(t)
	if _, err := console.New(console.Config{DB: db.Pool, Listen: "0.0.0.0:8089"}); !errors.Is(err, console.ErrTokenRequired) {
		t.Fatalf("New off loopback without a token: %v", err)
	}

	const token = "tok-with-enough-entropy"
	ts := start(t, db, console.Config{Listen: "0.0.0.0:8089", Token: token})
	for _, p := range []string{"/", "/dead-letters", "/dead-letters/1", "/events?id=1"} {
		code, body := get(t, http.DefaultClient, ts.URL, p)
		if code != http.StatusUnauthorized {
			t.Errorf("GET %s without token: %d", p, code)
		}
		mustContain(t, body, `action="/login"`)
	}
	bearer := func(tok string) int {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := bearer(token); code != http.StatusOK {
		t.Errorf("with bearer token: %d", code)
	}
	if code := bearer(token + "x"); code != http.StatusUnauthorized {
		t.Errorf("with a wrong bearer token: %d", code)
	}

	// The login form: a wrong token is refused, the right one sets an HttpOnly,
	// SameSite=Strict cookie that then admits the browser.
	c, tok := session(t, ts.URL, "/login")
	code, _, _ := post(t, c, ts.URL, "/login", url.Values{"csrf_token": {tok}, "token": {"nope"}, "next": {"/dead-letters"}}, nil)
	if code != http.StatusUnauthorized {
		t.Fatalf("login with a wrong token: %d", code)
	}
	code, _, h := post(t, c, ts.URL, "/login", url.Values{"csrf_token": {tok}, "token": {token}, "next": {"/dead-letters"}}, nil)
	if code != http.StatusSeeOther || h.Get("Location") != "/dead-letters" {
		t.Fatalf("login: %d to %q", code, h.Get("Location"))
	}
	cookie := h.Get("Set-Cookie")
	if !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") || strings.Contains(cookie, token) {
		t.Fatalf("session cookie %q", cookie)
	}
	if code, _ := get(t, c, ts.URL, "/dead-letters"); code != http.StatusOK {
		t.Fatalf("after login: %d", code)
	}
	// An open redirect is not possible through next.
	_, _, h = post(t, c, ts.URL, "/login", url.Values{"csrf_token": {tok}, "token": {token}, "next": {"//evil.example/"}}, nil)
	if h.Get("Location") != "/" {
		t.Fatalf("login next=//evil.example redirected to %q", h.Get("Location"))
	}
}

func TestLoopbackConsoleRefusesForeignHostNames(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ts := start(t, db, console.Config{})
	req, _ := http.NewRequest(http.MethodGet, ts.URL+"/dead-letters", nil)
	req.Host = "rebound.evil.example"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("foreign Host: %d, want 421", resp.StatusCode)
	}
	req.Host = "localhost:8089"
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("localhost Host: %d", resp.StatusCode)
	}
}

func TestStaticAssetsAreEmbedded(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ts := start(t, db, console.Config{})
	for _, p := range []string{"/static/console.css", "/static/console.js"} {
		code, body := get(t, http.DefaultClient, ts.URL, p)
		if code != http.StatusOK || len(body) < 100 {
			t.Errorf("%s: %d, %d bytes", p, code, len(body))
		}
	}
}
