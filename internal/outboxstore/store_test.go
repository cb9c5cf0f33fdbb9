package outboxstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// insertReady adds events that became ready one millisecond apart, in id order, after
// those of earlier calls: event i of the call gets partition key key(i).
func insertReady(t *testing.T, db *pgtest.DB, n int, key func(i int) string) {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = key(i)
	}
	if _, err := db.Pool.Exec(context.Background(), `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'test.event', k, '{}', now() - interval '1 hour' + (ord + (SELECT count(*) FROM outbox)) * interval '1 millisecond'
FROM unnest($1::text[]) WITH ORDINALITY AS u(k, ord)`, keys); err != nil {
		t.Fatal(err)
	}
}

// claimOnce claims up to n rows with runs of keyRun under a fresh one-minute lease.
func claimOnce(t *testing.T, s *outboxstore.Store, n, keyRun int) outboxstore.Claimed {
	t.Helper()
	lease, err := outboxstore.NewLease()
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(context.Background(), outboxstore.ClaimRequest{Lease: lease, Rows: n, KeyRun: keyRun, For: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return c
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
	seen := map[outbox.ID]bool{}
	last := map[string]outbox.ID{}
	claim := func(w want) {
		t.Helper()
		c := claimOnce(t, s, 100, 4)
		if c.Window != w.window || c.Len() != w.len || c.More != w.more {
			t.Fatalf("claim looked at %d rows and leased %d (more %v), want %+v", c.Window, c.Len(), c.More, w)
		}
		for _, m := range c.Messages {
			if seen[m.ID] {
				t.Fatalf("event %d claimed twice", m.ID)
			}
			if m.ID < last[m.PartitionKey] {
				t.Fatalf("key %s: event %d after %d", m.PartitionKey, m.ID, last[m.PartitionKey])
			}
			seen[m.ID], last[m.PartitionKey] = true, m.ID
		}
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
	if len(seen) != 500 {
		t.Fatalf("claimed %d distinct events, want 500", len(seen))
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
	ctx := context.Background()
	// ~350-byte rows: a few dozen pages.
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'test.event', 'k-' || g, jsonb_build_object('pad', repeat('x', 300)), now() - interval '1 hour'
FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}
	pages := func() map[int64]int64 {
		t.Helper()
		rows, err := db.Pool.Query(ctx, `SELECT id, (ctid::text::point)[0]::bigint FROM outbox`)
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
		c := claimOnce(t, s, 100, 1)
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
