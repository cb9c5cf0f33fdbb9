package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/console"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// groupFixture makes dead letters of three causes: 3 of topic t1 failing with "billing
// timed out", 2 of t1 failing with "schema mismatch", 2 of t2 failing with "billing timed
// out". Each error carries the event id, which the fingerprint normalises away.
type groupFixture struct {
	db                             *pgtest.DB
	timeoutT1, schemaT1, timeoutT2 []outbox.ID
}

func newGroupFixture(t *testing.T) groupFixture {
	t.Helper()
	db := pgtest.New(t)
	fx := groupFixture{db: db}
	fx.timeoutT1 = enqueue(t, db, events("t1", "ka", 3, nil))
	settle(t, db, true, "billing timed out", nil)
	fx.schemaT1 = enqueue(t, db, events("t1", "kb", 2, nil))
	settle(t, db, true, "schema mismatch", nil)
	fx.timeoutT2 = enqueue(t, db, events("t2", "kc", 2, nil))
	settle(t, db, true, "billing timed out", nil)
	return fx
}

// fingerprint returns the failure group of the letter of outbox row id.
func (fx groupFixture) fingerprint(t *testing.T, id outbox.ID) string {
	t.Helper()
	var fp string
	if err := fx.db.Pool.QueryRow(context.Background(), `SELECT fingerprint FROM dead_letters WHERE outbox_id = $1`, int64(id)).Scan(&fp); err != nil {
		t.Fatal(err)
	}
	return fp
}

var groupRowRE = regexp.MustCompile(`<tr data-group="([0-9a-f]{16})">`)

func groupsOnPage(body string) []string {
	var fps []string
	for _, m := range groupRowRE.FindAllStringSubmatch(body, -1) {
		fps = append(fps, m[1])
	}
	return fps
}

func TestGroupsPageListsTheGroupsAndEachLinksToExactlyItsLetters(t *testing.T) {
	t.Parallel()
	fx := newGroupFixture(t)
	ts := start(t, fx.db, console.Config{PageSize: 2})
	fpA, fpB, fpC := fx.fingerprint(t, fx.timeoutT1[0]), fx.fingerprint(t, fx.schemaT1[0]), fx.fingerprint(t, fx.timeoutT2[0])
	if fpA == fpB || fpA == fpC || fpB == fpC {
		t.Fatalf("fixture: three causes share fingerprints %s %s %s", fpA, fpB, fpC)
	}

	code, body := get(t, http.DefaultClient, ts.URL, "/dead-letters/groups")
	if code != http.StatusOK {
		t.Fatalf("groups page: %d", code)
	}
	// Largest first; then the most recently seen (t2's letters are newer than t1's schema ones).
	if got := groupsOnPage(body); !slices.Equal(got, []string{fpA, fpC, fpB}) {
		t.Fatalf("groups %v, want %v", got, []string{fpA, fpC, fpB})
	}
	mustContain(t, body, `<td class="num">3</td>`, "billing timed out (event &lt;n&gt;)", "schema mismatch (event &lt;n&gt;)",
		`href="/dead-letters?group=`+fpA+`"`)
	// Read-only: no redrive buttons.
	mustNotContain(t, body, `class="redrive-group"`)

	// The filter narrows the groups; a group has one source, so source filters groups too.
	_, body = get(t, http.DefaultClient, ts.URL, "/dead-letters/groups?topic=t1")
	if got := groupsOnPage(body); !slices.Equal(got, []string{fpA, fpB}) {
		t.Fatalf("groups of t1: %v", got)
	}
	mustContain(t, body, `href="/dead-letters?group=`+fpA+`&amp;topic=t1"`)
	_, body = get(t, http.DefaultClient, ts.URL, "/dead-letters/groups?source=delivery")
	mustContain(t, body, `id="no-groups"`)
	_, body = get(t, http.DefaultClient, ts.URL, "/dead-letters/groups?source=relay")
	if n := len(groupsOnPage(body)); n != 3 {
		t.Fatalf("relay groups: %d", n)
	}

	// The group filter lists exactly the group's letters, over keyset pages (page size 2).
	want := slices.Sorted(slices.Values(letterIDsOf(t, fx.db, fx.timeoutT1)))
	var seen []int64
	walkLetterPages(t, ts.URL, "group="+fpA, func(page int, body string) {
		if page == 0 {
			// The group's head: its pattern and count.
			mustContain(t, body, `id="group-`+fpA+`"`, `<span class="group-count">3</span>`, "billing timed out (event &lt;n&gt;)")
		}
		seen = append(seen, letterIDsOnPage(body)...)
	})
	if got := slices.Sorted(slices.Values(seen)); !slices.Equal(got, want) {
		t.Fatalf("group %s lists letters %v, want %v", fpA, got, want)
	}
	// Group and another criterion: ANDed.
	_, body = get(t, http.DefaultClient, ts.URL, "/dead-letters?group="+fpA+"&topic=t2")
	mustContain(t, body, `id="no-letters"`)
	_, body = get(t, http.DefaultClient, ts.URL, "/dead-letters?group="+fpC+"&limit=50")
	want = slices.Sorted(slices.Values(letterIDsOf(t, fx.db, fx.timeoutT2)))
	if got := slices.Sorted(slices.Values(letterIDsOnPage(body))); !slices.Equal(got, want) {
		t.Fatalf("group %s lists %v", fpC, got)
	}
}

func TestLetterDetailAndOverviewShowTheGroup(t *testing.T) {
	t.Parallel()
	fx := newGroupFixture(t)
	ts := start(t, fx.db, console.Config{})
	fp := fx.fingerprint(t, fx.schemaT1[1])
	letter := letterIDsOf(t, fx.db, fx.schemaT1[1:])[0]

	_, body := get(t, http.DefaultClient, ts.URL, fmt.Sprintf("/dead-letters/%d", letter))
	mustContain(t, body, `id="letter-group"`, `<a href="/dead-letters?group=`+fp+`"><code class="fingerprint">`+fp+`</code></a>: 2 open letter(s)`,
		"schema mismatch (event &lt;n&gt;)")

	// Once the group has no open letter, the letter still names it, linking to resolved ones.
	if _, err := deadletter.Redrive(context.Background(), fx.db.Pool, deadletter.Filter{Fingerprint: fp}, nil); err != nil {
		t.Fatal(err)
	}
	_, body = get(t, http.DefaultClient, ts.URL, fmt.Sprintf("/dead-letters/%d", letter))
	mustContain(t, body, `href="/dead-letters?group=`+fp+`&amp;resolved=1"`, "no open letter in this group")

	_, body = get(t, http.DefaultClient, ts.URL, "/")
	mustNotContain(t, body, `id="overview-groups"`) // on request only: it reads every open letter
	mustContain(t, body, `href="/?range=3h&amp;dead=groups"`)
	_, body = get(t, http.DefaultClient, ts.URL, "/?dead=groups")
	mustContain(t, body, `id="overview-groups"`)
	a, c := fx.fingerprint(t, fx.timeoutT1[0]), fx.fingerprint(t, fx.timeoutT2[0])
	if got := groupsOnPage(body); !slices.Equal(got, []string{a, c}) {
		t.Fatalf("overview groups %v, want %v (the redriven group is gone)", got, []string{a, c})
	}
}

func TestRedriveGroupAfterADryRunChangesExactlyItsRows(t *testing.T) {
	t.Parallel()
	fx := newGroupFixture(t)
	ts := start(t, fx.db, console.Config{AllowRedrive: true})
	fp := fx.fingerprint(t, fx.timeoutT1[0])
	c, tok := session(t, ts.URL, "/dead-letters/groups")
	_, body := get(t, c, ts.URL, "/dead-letters/groups")
	mustContain(t, body, `class="redrive-group"`, `<input type="hidden" name="group" value="`+fp+`">`, "Redrive 3…")

	// The dry run: deadletter.Plan's count, the group shown, nothing changed.
	plan, err := deadletter.Plan(context.Background(), fx.db.Pool, deadletter.Filter{Fingerprint: fp})
	if err != nil {
		t.Fatal(err)
	}
	code, body, _ := post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "group", fp), nil)
	if code != http.StatusOK {
		t.Fatalf("dry run: %d %s", code, clip(body))
	}
	mustContain(t, body, `data-dry-run="true"`, fmt.Sprintf(`Would redrive <strong id="redrive-count">%d</strong>`, len(plan.Redriven)),
		`id="group-`+fp+`"`, `<input type="hidden" name="group" value="`+fp+`">`, `id="confirm-redrive"`)
	if len(plan.Redriven) != 3 {
		t.Fatalf("Plan redrives %d letters of the group, want 3", len(plan.Redriven))
	}
	for _, id := range slices.Concat(fx.timeoutT1, fx.schemaT1, fx.timeoutT2) {
		if s := stateOf(t, fx.db, id); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
			t.Fatalf("dry run changed row %d: %+v", id, s)
		}
	}

	code, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "group", fp, "confirm", "1"), nil)
	if code != http.StatusOK {
		t.Fatalf("redrive: %d", code)
	}
	mustContain(t, body, `data-dry-run="false"`, `Redrove <strong id="redrive-count">3</strong>`)
	for _, id := range fx.timeoutT1 {
		if s := stateOf(t, fx.db, id); !s.Pending || s.Generation != 1 || s.Attempts != 0 || s.OpenLetters != 0 || s.RedrivenOnes != 1 {
			t.Fatalf("group row %d after the redrive: %+v", id, s)
		}
	}
	// Same topic, other cause; other topic, same error text: both untouched.
	for _, id := range slices.Concat(fx.schemaT1, fx.timeoutT2) {
		if s := stateOf(t, fx.db, id); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
			t.Fatalf("row %d outside the group changed: %+v", id, s)
		}
	}

	// A group with a source (which deadletter.Filter lacks) goes through ids, same result.
	fpC := fx.fingerprint(t, fx.timeoutT2[0])
	_, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "group", fpC, "source", "delivery", "confirm", "1"), nil)
	mustContain(t, body, `id="redrive-empty"`)
	_, body, _ = post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "group", fpC, "source", "relay", "confirm", "1"), nil)
	mustContain(t, body, `Redrove <strong id="redrive-count">2</strong>`)
	for _, id := range fx.schemaT1 {
		if s := stateOf(t, fx.db, id); s.Pending || s.OpenLetters != 1 {
			t.Fatalf("row %d of the third group changed: %+v", id, s)
		}
	}
}

func TestBadFingerprintIs400AndChangesNothing(t *testing.T) {
	t.Parallel()
	fx := newGroupFixture(t)
	ts := start(t, fx.db, console.Config{AllowRedrive: true})
	fp := fx.fingerprint(t, fx.timeoutT1[0])
	bad := []string{"xyz", "0123456789ABCDEF", fp + "0", fp[:15], "'; drop table outbox; --", "0123456789abcdeg"}
	for _, g := range bad {
		for _, page := range []string{"/dead-letters?", "/dead-letters/groups?"} {
			code, body := get(t, http.DefaultClient, ts.URL, page+url.Values{"group": {g}}.Encode())
			if code != http.StatusBadRequest {
				t.Errorf("%sgroup=%q: %d, want 400", page, g, code)
			}
			mustContain(t, body, `class="error">group:`)
		}
	}
	c, tok := session(t, ts.URL, "/dead-letters")
	for _, g := range bad {
		code, _, _ := post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "group", g, "confirm", "1"), nil)
		if code != http.StatusBadRequest {
			t.Errorf("redrive group=%q: %d, want 400", g, code)
		}
	}
	for _, id := range slices.Concat(fx.timeoutT1, fx.schemaT1, fx.timeoutT2) {
		if s := stateOf(t, fx.db, id); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
			t.Fatalf("row %d changed: %+v", id, s)
		}
	}
}

func TestGroupRedriveKeepsReadOnlyAndCSRFRules(t *testing.T) {
	t.Parallel()
	fx := newGroupFixture(t)
	fp := fx.fingerprint(t, fx.timeoutT1[0])
	unchanged := func(when string) {
		t.Helper()
		for _, id := range fx.timeoutT1 {
			if s := stateOf(t, fx.db, id); s.Pending || s.Generation != 0 || s.OpenLetters != 1 {
				t.Fatalf("%s: row %d changed: %+v", when, id, s)
			}
		}
	}

	ro := start(t, fx.db, console.Config{})
	c, tok := session(t, ro.URL, "/dead-letters/groups")
	for _, form := range []url.Values{
		redriveForm(tok, "scope", "filter", "group", fp),
		redriveForm(tok, "scope", "filter", "group", fp, "confirm", "1"),
	} {
		if code, _, _ := post(t, c, ro.URL, "/dead-letters/redrive", form, nil); code != http.StatusForbidden {
			t.Fatalf("read-only group redrive %v: %d, want 403", form, code)
		}
	}
	_, body := get(t, c, ro.URL, "/dead-letters?group="+fp)
	mustNotContain(t, body, `id="redrive-filter"`)
	unchanged("read-only")

	rw := start(t, fx.db, console.Config{AllowRedrive: true})
	c, tok = session(t, rw.URL, "/dead-letters/groups")
	_, otherTok := session(t, rw.URL, "/dead-letters/groups")
	for name, tc := range map[string]struct {
		client *http.Client
		form   url.Values
		hdr    map[string]string
	}{
		"no token":                {c, url.Values{"scope": {"filter"}, "group": {fp}, "confirm": {"1"}}, nil},
		"wrong token":             {c, redriveForm("AAAA"+tok[4:], "scope", "filter", "group", fp, "confirm", "1"), nil},
		"another browser's token": {c, redriveForm(otherTok, "scope", "filter", "group", fp, "confirm", "1"), nil},
		"cross-site origin":       {c, redriveForm(tok, "scope", "filter", "group", fp, "confirm", "1"), map[string]string{"Origin": "https://evil.example"}},
	} {
		if code, _, _ := post(t, tc.client, rw.URL, "/dead-letters/redrive", tc.form, tc.hdr); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, code)
		}
		unchanged(name)
	}
	// With the token it goes through (so the refusals above were the rules, not a broken form).
	if code, body, _ := post(t, c, rw.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "group", fp, "confirm", "1"), nil); code != http.StatusOK {
		t.Fatalf("group redrive with the token: %d %s", code, clip(body))
	}
	if s := stateOf(t, fx.db, fx.timeoutT1[0]); !s.Pending || s.Generation != 1 {
		t.Fatalf("after the redrive: %+v", s)
	}
}

// TestRedriveClearsTheChartCache: a redriven event counts as pending since its creation,
// which changes finished buckets; the console's own redrive drops them, a dry run does not.
func TestRedriveClearsTheChartCache(t *testing.T) {
	t.Parallel()
	fx := newGroupFixture(t)
	srv, ts := serve(t, fx.db, console.Config{AllowRedrive: true})
	c, tok := session(t, ts.URL, "/")
	if n := console.CachedChartBuckets(srv); n < 100 {
		t.Fatalf("the overview cached %d buckets of 180", n)
	}
	fp := fx.fingerprint(t, fx.schemaT1[0])
	post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "group", fp), nil)
	if n := console.CachedChartBuckets(srv); n < 100 {
		t.Fatalf("a dry run dropped the chart cache (%d left)", n)
	}
	post(t, c, ts.URL, "/dead-letters/redrive", redriveForm(tok, "scope", "filter", "group", fp, "confirm", "1"), nil)
	if n := console.CachedChartBuckets(srv); n != 0 {
		t.Fatalf("%d chart buckets still cached after a redrive", n)
	}
}
