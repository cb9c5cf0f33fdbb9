package outboxstore_test

import (
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// insertReady adds events that became ready one millisecond apart, in id order, after
// those of earlier calls: event i of the call gets partition key key(i).
func insertReady(t *testing.T, db *pgtest.DB, n int, key func(i int) string) {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = key(i)
	}
	outboxtest.Exec(t, db.Pool, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'test.event', k, '{}', now() - interval '1 hour' + (ord + (SELECT count(*) FROM outbox)) * interval '1 millisecond'
FROM unnest($1::text[]) WITH ORDINALITY AS u(k, ord)`, keys)
}

// claimOnce claims what req asks (its Rows, KeyRun and MaxBytes) under a fresh one-minute
// lease.
func claimOnce(t *testing.T, s *outboxstore.Store, req outboxstore.ClaimRequest) outboxstore.Claimed {
	t.Helper()
	lease, err := outboxstore.NewLease()
	if err != nil {
		t.Fatal(err)
	}
	req.Lease, req.For = lease, time.Minute
	c, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// claimLog follows the claims of a test: no event may be claimed twice, and every key's
// events must come out in id order.
type claimLog struct {
	seen map[outbox.ID]bool
	last map[string]outbox.ID
}

func newClaimLog() *claimLog {
	return &claimLog{seen: map[outbox.ID]bool{}, last: map[string]outbox.ID{}}
}

// record fails the test if c claims an event again or out of its key's order.
func (l *claimLog) record(t *testing.T, c outboxstore.Claimed) {
	t.Helper()
	for _, m := range c.Messages {
		if l.seen[m.ID] {
			t.Fatalf("event %d claimed twice", m.ID)
		}
		if m.ID < l.last[m.PartitionKey] {
			t.Fatalf("key %s: event %d after %d", m.PartitionKey, m.ID, l.last[m.PartitionKey])
		}
		l.seen[m.ID], l.last[m.PartitionKey] = true, m.ID
	}
}

// The window follows the backlog: after a full batch that took its rows from the first
// keys of the window, the next claim looks at twice that many rows; when that window
// turns out too small (keys with one event each), the batch is short but says More, and
// the claim after it looks at the whole batch size again. No event is claimed twice or
// left behind, and every key's events come out in id order.
func TestClaimWindowFollowsTheBacklog(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// 25 keys with 4 events each, then 400 keys with one event each.
	insertReady(t, db, 100, func(i int) string { return "hot-" + string(rune('a'+i%25)) })
	insertReady(t, db, 400, func(i int) string { return "one-" + time.Duration(i).String() })
	s := outboxstore.NewStore(db.Pool)

	type want struct {
		window, len int
		more        bool
	}
	log := newClaimLog()
	claim := func(w want) {
		t.Helper()
		c := claimOnce(t, s, outboxstore.ClaimRequest{Rows: 100, KeyRun: 4})
		if c.Window != w.window || c.Len() != w.len || c.More != w.more {
			t.Fatalf("claim looked at %d rows and leased %d (more %v), want %+v", c.Window, c.Len(), c.More, w)
		}
		log.record(t, c)
	}
	// 25 keys fill the batch with runs of 4: the batch needed 25 rows of the window.
	claim(want{window: 100, len: 100, more: true})
	// 50 rows, all keys with one event: short, and the window was full.
	claim(want{window: 50, len: 50, more: true})
	// The whole batch size again, which one-event keys need.
	for range 3 {
		claim(want{window: 100, len: 100, more: true})
	}
	// The last 50 of 500: every ready row was seen.
	claim(want{window: 100, len: 50, more: false})
	if len(log.seen) != 500 {
		t.Fatalf("claimed %d distinct events, want 500", len(log.seen))
	}
}

// The claim's lease and the mark each write a new version of the row. The outbox keeps
// half of every page free (migration 0013), so the lease's version stays on the row's page,
// where the WAL records only the changed part of the row; with full pages it would go to
// another page. The mark's version stays too once the page is pruned of the versions no
// transaction can still see, which other sessions' open snapshots can delay, so only the
// lease is checked here.
func TestClaimStaysOnTheRowsPage(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// ~350-byte rows: a few dozen pages.
	outboxtest.Exec(t, db.Pool, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'test.event', 'k-' || g, jsonb_build_object('pad', repeat('x', 300)), now() - interval '1 hour'
FROM generate_series(1, 1000) g`)
	pages := func() map[int64]int64 {
		t.Helper()
		rows, err := db.Pool.Query(t.Context(), `SELECT id, (ctid::text::point)[0]::bigint FROM outbox`)
		if err != nil {
			t.Fatal(err)
		}
		m := map[int64]int64{}
		for rows.Next() {
			var id, page int64
			if err := rows.Scan(&id, &page); err != nil {
				t.Fatal(err)
			}
			m[id] = page
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := pages()
	s := outboxstore.NewStore(db.Pool)
	claimed := 0
	for {
		c := claimOnce(t, s, outboxstore.ClaimRequest{Rows: 100, KeyRun: 1})
		claimed += c.Len()
		if !c.More {
			break
		}
	}
	after := pages()
	moved := 0
	for id, page := range before {
		if after[id] != page {
			moved++
		}
	}
	if claimed != 1000 || len(after) != 1000 || moved > 0 {
		t.Fatalf("claimed %d of 1000; %d rows left their page, want none", claimed, moved)
	}
}

// The byte budget cuts a claim after the rows whose payloads fill it, keeps every key's
// events in order, says More so the drain goes on, and still moves one event larger than
// the budget; every event is claimed once.
func TestClaimByteBudget(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// 20 events of ~1 kB over 5 keys: small enough to be stored uncompressed.
	outboxtest.Exec(t, db.Pool, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'test.event', 'k-' || (g % 5), jsonb_build_object('pad', repeat('x', 1000)), now() - interval '1 hour' + g * interval '1 millisecond'
FROM generate_series(1, 20) g`)
	s := outboxstore.NewStore(db.Pool)
	log := newClaimLog()
	// Each claim is marked, so a key whose run a claim cut short is not held behind it.
	claim := func(maxBytes int64) outboxstore.Claimed {
		t.Helper()
		lease, c := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 100, KeyRun: 4, MaxBytes: maxBytes})
		mark(t, s, lease, c)
		log.record(t, c)
		var bytes int64
		for _, m := range c.Messages {
			bytes += int64(len(m.Payload))
		}
		if bytes != c.Bytes {
			t.Fatalf("Bytes %d, payloads %d", c.Bytes, bytes)
		}
		return c
	}
	// 4,500 bytes hold four of the ~1,012-byte payloads, not five: the budget holds, with
	// no event past it. The Store's first claim assumes Postgres compressed them (it did
	// not: coldTextPerStored) and takes one; the next claims learn the ratio and ramp up
	// to four, each cut (so More) until the last.
	var sizes []int
	for left := 20; left > 0; {
		c := claim(4500)
		last := c.Len() == left
		if c.Len() == 0 || c.Len() > 4 || c.Bytes > 4500 || c.More == last {
			t.Fatalf("claims %v, then %d rows, %d bytes, more %v; want 1-4 rows within 4,500 bytes, more until the last", sizes, c.Len(), c.Bytes, c.More)
		}
		sizes = append(sizes, c.Len())
		left -= c.Len()
	}
	if len(sizes) > 7 || slices.Index(sizes, 4) < 0 || slices.Index(sizes, 4) > 2 {
		t.Fatalf("claims took %v rows: want four per claim from the third on", sizes)
	}

	// One event over the budget still moves, alone (hex digits: Postgres cannot compress
	// them, so the stored size is the size).
	outboxtest.Exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload) VALUES
		('test.event', 'big', jsonb_build_object('pad', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 160) i))),
		('test.event', 'after', '{}')`)
	if c := claim(1000); c.Len() != 1 || c.Bytes < 5000 || !c.More {
		t.Fatalf("over-budget event: %d rows, %d bytes, more %v; want it alone, more", c.Len(), c.Bytes, c.More)
	}
	if c := claim(1000); c.Len() != 1 || c.BytesCut || c.Messages[0].PartitionKey != "after" {
		t.Fatalf("the event after it: %d rows, cut %v", c.Len(), c.BytesCut)
	}
}

// TestReleaseLease: the rows of a claim whose answer never reached the relay (its session
// was cut off after the claim committed) are given back by their lease alone: pending and
// ready again, the attempt uncounted, no lease left for the next claim to count as a
// relay death; another lease's rows are left alone.
func TestReleaseLease(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	insertReady(t, db, 6, func(i int) string { return "k-" + string(rune('a'+i)) })
	s := outboxstore.NewStore(db.Pool)
	lost, err := outboxstore.NewLease()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(t.Context(), outboxstore.ClaimRequest{Lease: lost, Rows: 4, KeyRun: 1, For: time.Minute}); err != nil {
		t.Fatal(err)
	}
	kept := claimOnce(t, s, outboxstore.ClaimRequest{Rows: 2, KeyRun: 1})
	n, err := s.ReleaseLease(t.Context(), lost)
	if err != nil || n != 4 {
		t.Fatalf("released %d rows (%v), want the 4 of the lost claim", n, err)
	}
	if got := db.Count(t, `SELECT count(*) FROM outbox WHERE lease_token IS NULL AND attempts = 0 AND available_at <= now()`); got != 4 {
		t.Fatalf("%d rows ready again without a lease or an attempt, want 4", got)
	}
	if got := db.Count(t, `SELECT count(*) FROM outbox WHERE lease_token IS NOT NULL`); got != kept.Len() {
		t.Fatalf("%d rows still leased, want the other claim's %d", got, kept.Len())
	}
}
