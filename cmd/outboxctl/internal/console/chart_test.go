package console

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestSeriesRebuildsPendingHistory writes rows at known times (the store takes the time
// of claim, mark and dead-letter) and checks every bucket of the three series.
func TestSeriesRebuildsPendingHistory(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// Nine rows created by one statement (one created_at, t0).
	evs := make([]outbox.Event, 9)
	for i := range evs {
		p, _ := json.Marshal(map[string]int{"i": i})
		evs[i] = outbox.Event{Topic: "t", PartitionKey: "k" + string(rune('a'+i)), Payload: p}
	}
	ids, err := outbox.EnqueueBatch(ctx, db.Pool, evs)
	if err != nil {
		t.Fatal(err)
	}
	var t0 time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT min(created_at) FROM outbox`).Scan(&t0); err != nil {
		t.Fatal(err)
	}
	store := outboxstore.NewStore(db.Pool)
	// step claims every ready row at `at`, dispatches or dead-letters `done` and releases
	// the rest (still pending).
	step := func(done []outbox.ID, at time.Time, dead bool) {
		lease, _ := outboxstore.NewLease()
		claimed, err := store.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: 100, KeyRun: 1, For: time.Hour, Now: &at})
		msgs := claimed.Messages
		if err != nil {
			t.Fatalf("claim at %s: %v", at, err)
		}
		var rest []outbox.ID
		for _, m := range msgs {
			if !slices.Contains(done, m.ID) {
				rest = append(rest, m.ID)
			}
		}
		if dead {
			fails := make([]outboxstore.Failure, len(done))
			for i, id := range done {
				fails[i] = outboxstore.Failure{ID: id, Error: "no"}
			}
			_, err = store.DeadLetter(ctx, lease, fails, &at)
		} else {
			_, err = store.MarkDispatched(ctx, lease, done, &at)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Release(ctx, lease, rest, &at); err != nil {
			t.Fatal(err)
		}
	}
	step(ids[:3], t0.Add(10*time.Minute), false) // 3 pending t0..t0+10m, then dispatched
	step(ids[3:5], t0.Add(25*time.Minute), true) // 2 pending t0..t0+25m, then dead-lettered
	// ids[5:] are still pending.

	now := t0.Add(40 * time.Minute)
	s, err := loadSeries(ctx, db.Pool, pickRange("1h"), now, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Pending) != 60 {
		t.Fatalf("%d buckets", len(s.Pending))
	}
	bucket := func(at time.Time) int { return int(at.Sub(s.Start) / time.Minute) }
	cb, d1, d2 := bucket(t0), bucket(t0.Add(10*time.Minute)), bucket(t0.Add(25*time.Minute))
	for i := range s.Pending {
		var want int64
		switch {
		case i < cb:
			want = 0
		case i < d1:
			want = 9
		case i < d2:
			want = 6
		default:
			want = 4
		}
		if s.Pending[i] != want {
			t.Fatalf("pending[%d] = %d, want %d (created in %d, dispatched in %d, dead-lettered in %d): %v", i, s.Pending[i], want, cb, d1, d2, s.Pending)
		}
		wantDisp := 0.0
		if i == d1 {
			wantDisp = 3
		}
		if s.Dispatched[i] != wantDisp {
			t.Fatalf("dispatched[%d] = %v, want %v", i, s.Dispatched[i], wantDisp)
		}
		if (i == d2) != (s.DeadLettered[i] == 2) {
			t.Fatalf("dead-lettered[%d] = %d", i, s.DeadLettered[i])
		}
		if want == 0 && s.OldestAge[i] != 0 || want > 0 && s.OldestAge[i] <= 0 {
			t.Fatalf("oldest[%d] = %s with %d pending", i, s.OldestAge[i], want)
		}
	}
	// The last bucket ends now: the oldest pending row is 40 minutes old.
	if got := s.OldestAge[59]; got != 40*time.Minute {
		t.Fatalf("oldest age now = %s, want 40m", got)
	}

	svg := string(renderChart(s))
	for _, want := range []string{`data-series="pending" data-points="60" data-max="9"`, `data-series="dispatched" data-points="60" data-max="3"`,
		`data-series="age"`, `<polygon class="area"`, "</svg>"} {
		if !strings.Contains(svg, want) {
			t.Fatalf("chart lacks %q:\n%s", want, svg)
		}
	}
	if strings.Contains(svg, "style=") || strings.Contains(svg, "<script") {
		t.Fatal("chart uses inline style or script, which the CSP blocks")
	}
}

func TestRangesNeverReachTheQuery(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "3h", "1h": "1h", "24h": "24h", "7d": "3h", "1h'--": "3h"} {
		if got := pickRange(in).Name; got != want {
			t.Errorf("pickRange(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestParseWhenAndCursor(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-04-30T10:00:00Z": time.Date(2026, 4, 30, 10, 0, 0, 0, time.UTC),
		"2026-04-30T10:00":     time.Date(2026, 4, 30, 10, 0, 0, 0, time.UTC),
		"2026-04-30":           time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC),
		"90m":                  now.Add(-90 * time.Minute),
		"":                     {},
	} {
		got, err := parseWhen(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseWhen(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"yesterday", "-5m", "2026-13-01"} {
		if _, err := parseWhen(bad, now); err == nil {
			t.Errorf("parseWhen(%q) accepted", bad)
		}
	}
	c := cursor{At: time.UnixMicro(1_700_000_000_123_456), ID: 42}
	back, err := parseCursor(c.String())
	if err != nil || !back.At.Equal(c.At) || back.ID != 42 {
		t.Fatalf("cursor round trip: %+v, %v", back, err)
	}
}

func TestTraceID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		h    map[string]string
		want string
	}{
		{map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "4bf92f3577b34da6a3ce929d0e0e4736"},
		{map[string]string{"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}, "4bf92f3577b34da6a3ce929d0e0e4736"},
		{map[string]string{"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, ""},
		{map[string]string{"traceparent": "garbage"}, ""},
		{nil, ""},
	} {
		if got := traceID(tc.h); got != tc.want {
			t.Errorf("traceID(%v) = %q, want %q", tc.h, got, tc.want)
		}
	}
}

// TestChartCacheReadsOnlyTheBucketsItHasNot: a finished bucket comes from the cache (its
// rows can be gone from the table and it still shows them), the recent ones are read
// again (a new dispatch shows), and reset drops the cache.
func TestChartCacheReadsOnlyTheBucketsItHasNot(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	now := time.Now().Truncate(time.Minute).Add(30 * time.Second)
	insert := func(n int, created time.Time, dispatched *time.Time) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `
INSERT INTO outbox (topic, partition_key, payload, created_at, available_at, dispatched_at, attempts)
SELECT 't', 'k' || g, '{}', $2, $2, $3, 1 FROM generate_series(1, $1::int) g`, n, created, dispatched)
		if err != nil {
			t.Fatal(err)
		}
	}
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	insert(5, now.Add(-50*time.Minute), at(-40*time.Minute)) // history: pending 50 to 40 minutes ago
	insert(3, now.Add(-30*time.Minute), nil)                 // still pending
	rg := pickRange("1h")
	fresh := func() Series {
		t.Helper()
		s, err := loadSeries(ctx, db.Pool, rg, now, 3)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	c := &chartCache{}
	cached := func() Series {
		t.Helper()
		s, err := c.series(ctx, db.Pool, rg, now, 3)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := cached()
	want := fresh()
	if !slices.Equal(first.Pending, want.Pending) || !slices.Equal(first.Dispatched, want.Dispatched) || !slices.Equal(first.OldestAge, want.OldestAge) {
		t.Fatalf("cold cache differs from a fresh read:\n%v\n%v", first.Pending, want.Pending)
	}
	i40 := int(now.Add(-40*time.Minute).Sub(first.Start) / time.Minute)
	if first.Pending[i40-1] != 5 || first.Dispatched[i40] != 5 {
		t.Fatalf("fixture: pending %d before, dispatched %v at 40 minutes ago", first.Pending[i40-1], first.Dispatched[i40])
	}

	// The history changes behind the cache's back; a dispatch happens in the current bucket.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM outbox WHERE dispatched_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	insert(2, now.Add(-30*time.Second), at(-10*time.Second))
	second := cached()
	last := len(second.Pending) - 1
	if second.Pending[i40-1] != 5 || second.Dispatched[i40] != 5 {
		t.Fatalf("finished buckets were read again: pending %d, dispatched %v", second.Pending[i40-1], second.Dispatched[i40])
	}
	if second.Dispatched[last] != 2 || second.Pending[last] != 3 {
		t.Fatalf("the current bucket was not read again: dispatched %v, pending %d", second.Dispatched[last], second.Pending[last])
	}
	if f := fresh(); f.Dispatched[i40] != 0 {
		t.Fatalf("a fresh read still shows the deleted history: %v", f.Dispatched[i40])
	}

	c.reset()
	third, f := cached(), fresh()
	if !slices.Equal(third.Pending, f.Pending) || !slices.Equal(third.Dispatched, f.Dispatched) {
		t.Fatal("after reset the cache still answers")
	}
}
