package outboxstore_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// insertCompressible adds n events of about 400 kB of JSON order lines, all alike, that
// Postgres stores compressed about a hundredfold, over keys keys, ready in id order.
func insertCompressible(t *testing.T, db *pgtest.DB, n, keys int) {
	t.Helper()
	outboxtest.Exec(t, db.Pool, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'order.created', 'k-' || (g % $2), jsonb_build_object('order', g, 'lines',
           (SELECT jsonb_agg(jsonb_build_object('sku', 'SKU-000042', 'qty', 1, 'note', 'gift wrap, no invoice'))
            FROM generate_series(1, 6000))),
       now() - interval '1 hour' + g * interval '1 millisecond'
FROM generate_series(1, $1::int) g`, n, keys)
}

// The byte budget holds on the first claim of a fresh Store whatever the payloads'
// compression: 400 kB events that Postgres stores about 60 times smaller passed the
// stored-size budget that many times over (every row of the batch, 16 MB for a 2 MB
// budget). Now the claim keeps payloads only while their text fits (what it leases past
// that it gives back: TestClaimGivesBackPastTheBudget), leaves the rest ready and
// unattempted, keeps every key's events in order, and the next claims take the rest;
// every event is claimed once.
func TestClaimByteBudgetHoldsForCompressiblePayloads(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	insertCompressible(t, db, 40, 3)
	var text, stored float64
	scan(t, db, `SELECT avg(octet_length(payload::text)), avg(pg_column_size(payload)) FROM outbox`, &text, &stored)
	if text < 390_000 || text/stored < 50 {
		t.Fatalf("payloads of %.0f bytes stored in %.0f: want ~400 kB compressing at least fiftyfold", text, stored)
	}
	const budget = 2 << 20
	s := outboxstore.NewStore(db.Pool)
	log := newClaimLog()
	for i := 0; len(log.seen) < 40; i++ {
		if i == 40 {
			t.Fatalf("after 40 claims, %d of 40 events claimed", len(log.seen))
		}
		lease, c := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 100, KeyRun: 4, MaxBytes: budget})
		log.record(t, c)
		var held int64
		for _, m := range c.Messages {
			held += int64(len(m.Payload))
		}
		if held != c.Bytes || c.Bytes > budget || c.Len() == 0 {
			t.Fatalf("claim %d: %d rows holding %d payload bytes (Bytes %d); want some, within the %d-byte budget", i, c.Len(), held, c.Bytes, budget)
		}
		if i == 0 {
			// What the first claim did not keep is ready, its attempt uncounted.
			var back, leftLeased int
			scan(t, db, `SELECT count(*) FILTER (WHERE attempts = 0 AND lease_token IS NULL AND available_at <= now()),
			       count(*) FILTER (WHERE lease_token IS NOT NULL)
			FROM outbox`, &back, &leftLeased)
			if back != 40-c.Len() || leftLeased != c.Len() || !c.More || !c.BytesCut {
				t.Fatalf("first claim took %d rows (more %v, cut %v): %d rows ready and unattempted, %d leased; want the other %d given back",
					c.Len(), c.More, c.BytesCut, back, leftLeased, 40-c.Len())
			}
		}
		mark(t, s, lease, c)
	}
}

// claimLeased is claimOnce that returns the lease too.
func claimLeased(t *testing.T, s *outboxstore.Store, req outboxstore.ClaimRequest) (outboxstore.Lease, outboxstore.Claimed) {
	t.Helper()
	lease, err := outboxstore.NewLease()
	if err != nil {
		t.Fatal(err)
	}
	req.Lease = lease
	if req.For == 0 {
		req.For = time.Minute
	}
	c, err := s.Claim(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	return lease, c
}

// What Postgres renders beyond the budget is given back under the claim's lease: padded
// documents of 400 kB stored about 87 times smaller pass even the first claim's assumed
// ratio (coldTextPerStored), so the stored budget lets seven through where the text
// budget holds five. The two past it are ready again at once with no attempt counted, and
// every key keeps a prefix of its events (a given-back event is never older than a kept
// one of its key).
func TestClaimGivesBackPastTheBudget(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	outboxtest.Exec(t, db.Pool, `
INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'doc.padded', 'k-' || (g % 2), jsonb_build_object('n', g, 'pad', repeat('x', 400000)), now() - interval '1 hour' + g * interval '1 millisecond'
FROM generate_series(1, 20) g`)
	s := outboxstore.NewStore(db.Pool)
	_, c := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 100, KeyRun: 4, MaxBytes: 2 << 20})
	if len(c.Messages) != 5 || c.Bytes > 2<<20 || !c.BytesCut || !c.More {
		t.Fatalf("%d rows, %d bytes, cut %v, more %v; want the 5 that fit 2 MiB, cut, more", len(c.Messages), c.Bytes, c.BytesCut, c.More)
	}
	kept := map[string]outbox.ID{} // per key, the newest kept event
	for _, m := range c.Messages {
		kept[m.PartitionKey] = max(kept[m.PartitionKey], m.ID)
	}
	// Every other event: given back (ready again since the claim, the lease cleared, no
	// attempt) or never chosen (untouched); either way newer than its key's kept ones.
	rows, err := db.Pool.Query(t.Context(), `
SELECT id, partition_key, attempts, lease_token IS NULL, available_at > now() - interval '1 minute', available_at <= now()
FROM outbox WHERE NOT id = ANY($1::bigint[]) ORDER BY id`, ids(c))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	given := 0
	for rows.Next() {
		var id outbox.ID
		var key string
		var attempts int
		var free, back, ready bool
		if err := rows.Scan(&id, &key, &attempts, &free, &back, &ready); err != nil {
			t.Fatal(err)
		}
		if attempts != 0 || !free || !ready {
			t.Errorf("event %d not kept: attempts %d, lease cleared %v, ready %v; want it ready, unleased, unattempted", id, attempts, free, ready)
		}
		if id < kept[key] {
			t.Errorf("event %d of %s is not kept but %d is", id, key, kept[key])
		}
		if back {
			given++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if given != 2 {
		t.Errorf("%d events given back, want the 2 the stored size let through past the text budget", given)
	}
}

// ids are the ids of c's messages.
func ids(c outboxstore.Claimed) []outbox.ID {
	out := make([]outbox.ID, 0, len(c.Messages))
	for _, m := range c.Messages {
		out = append(out, m.ID)
	}
	return out
}

// mark records c's rows as dispatched under lease.
func mark(t *testing.T, s *outboxstore.Store, lease outboxstore.Lease, c outboxstore.Claimed) {
	t.Helper()
	ids := make([]outbox.ID, 0, len(c.Messages))
	for _, m := range c.Messages {
		ids = append(ids, m.ID)
	}
	if _, err := s.MarkDispatched(t.Context(), lease, ids, nil); err != nil {
		t.Fatal(err)
	}
}

// scan runs a one-row query into dest.
func scan(t *testing.T, db *pgtest.DB, sql string, dest ...any) {
	t.Helper()
	if err := db.Pool.QueryRow(t.Context(), sql).Scan(dest...); err != nil {
		t.Fatal(err)
	}
}

// A row that a claim died holding (its lease ran out with no outcome) is claimed alone
// from then on, so that only it dies again; after DefaultMaxDeaths deaths in a row it
// comes back in Undecodable, its payload unread, with the reason to dead-letter it, while
// every other row is claimed and marked. Its key's later event waits for it, then goes.
func TestClaimIsolatesARowItsRelayDiesHolding(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	insertReady(t, db, 6, func(i int) string { return fmt.Sprint("k-", i%3) })
	var guilty outbox.ID
	scan(t, db, `SELECT id FROM outbox ORDER BY id OFFSET 1 LIMIT 1`, &guilty)
	s := outboxstore.NewStore(db.Pool)
	clock := time.Now()
	marked := map[outbox.ID]int{}
	var died, letters int
	for i := 0; ; i++ {
		if i == 20 {
			t.Fatalf("20 claims did not settle 6 rows: %d marked, guilty died %d times", len(marked), died)
		}
		// Each claim after every lease of the last has ended.
		clock = clock.Add(2 * time.Minute)
		lease, c := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 100, KeyRun: 4, For: time.Minute, Now: &clock})
		if c.Len() == 0 {
			break
		}
		if i == 0 && c.Len() != 6 {
			t.Fatalf("first claim took %d rows, want all 6", c.Len())
		}
		if i > 0 && (c.Len() != 1 || !c.Isolated || !c.More || c.BytesCut) {
			t.Fatalf("claim %d took %d rows after the batch died (isolated %v, more %v, bytes cut %v): want every row of that batch alone, isolated, more",
				i, c.Len(), c.Isolated, c.More, c.BytesCut)
		}
		if len(c.Undecodable) > 0 {
			f := c.Undecodable[0]
			if f.ID != guilty || !strings.Contains(f.Error, "the relay died 3 times while holding this row") {
				t.Fatalf("claim %d: refused %d (%s); want %d, the relay died 3 times", i, f.ID, f.Error, guilty)
			}
			if n, err := s.DeadLetter(t.Context(), lease, c.Undecodable, &clock); err != nil || n != 1 {
				t.Fatalf("dead-letter: %d, %v", n, err)
			}
			letters++
			continue
		}
		if c.Messages[0].ID == guilty && c.Deaths != died {
			t.Fatalf("claim %d: the guilty row after %d deaths says Deaths %d", i, died, c.Deaths)
		}
		if c.Messages[0].ID == guilty || i == 0 {
			died++ // the process dies holding the batch: no outcome, the lease runs out
			continue
		}
		marked[c.Messages[0].ID]++
		mark(t, s, lease, c)
	}
	if len(marked) != 5 || died != 3 || letters != 1 {
		t.Fatalf("%d rows marked, the guilty one died %d times and was dead-lettered %d times; want 5, 3, 1", len(marked), died, letters)
	}
	var reason string
	scan(t, db, fmt.Sprintf(`SELECT error FROM dead_letters WHERE outbox_id = %d`, guilty), &reason)
	if !strings.Contains(reason, "the relay died 3 times while holding this row") {
		t.Fatalf("dead letter's error %q", reason)
	}

	// Redriven, it is an event like any other: its count of deaths starts again.
	if _, err := deadletter.Redrive(t.Context(), db.Pool, deadletter.Filter{All: true}, nil); err != nil {
		t.Fatal(err)
	}
	// A fresh Store (the next process): this one's walk bounds, learnt at the test's clock,
	// lie past the redrive's real time (walk.go's probe finds such rows, later).
	clock = clock.Add(2 * time.Minute)
	_, c := claimLeased(t, outboxstore.NewStore(db.Pool), outboxstore.ClaimRequest{Rows: 100, KeyRun: 4, For: time.Minute, Now: &clock})
	if len(c.Messages) != 1 || len(c.Undecodable) != 0 || c.Messages[0].ID != guilty || c.Deaths != 0 || c.Isolated {
		t.Fatalf("redriven: claimed %+v, refused %+v, deaths %d, isolated %v; want the row, as any other", c.Messages, c.Undecodable, c.Deaths, c.Isolated)
	}
}

// Unclaim hands a suspect back as though the claim had not taken it: the next claim
// finds it a suspect still, with the same count of deaths and attempts, where Release
// (an outcome) would have wiped its deaths. A row that is no suspect is not touched.
func TestUnclaimKeepsARowsDeaths(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	insertReady(t, db, 3, func(i int) string { return fmt.Sprint("k-", i) })
	s := outboxstore.NewStore(db.Pool)
	clock := time.Now().Add(time.Minute)
	_, died := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 2, KeyRun: 1, For: time.Minute, Now: &clock})
	clock = clock.Add(2 * time.Minute) // the process died holding them: the lease ran out

	// The third row, never leased, comes first; the suspects end the batch behind it.
	lease, healthy := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 10, KeyRun: 1, For: time.Minute, Now: &clock})
	if n, err := s.Unclaim(t.Context(), lease, ids(healthy), &clock); err != nil || n != 0 || healthy.Len() != 1 {
		t.Fatalf("unclaim of %v, a row no relay died holding: %d, %v; want nothing done", ids(healthy), n, err)
	}
	mark(t, s, lease, healthy)

	lease, c := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 10, KeyRun: 1, For: time.Minute, Now: &clock})
	if len(c.Messages) != 1 || c.Messages[0].ID != died.Messages[0].ID || c.Deaths != 1 || !c.Isolated {
		t.Fatalf("claim after the death: %v deaths %d isolated %v; want row %d alone, one death", ids(c), c.Deaths, c.Isolated, died.Messages[0].ID)
	}
	// Handed back at the database's time, before the other suspect's lease end, it is the
	// first ready row again (for a fresh Store: this one's walk bounds were learnt at the
	// test's later clock).
	if n, err := s.Unclaim(t.Context(), lease, ids(c), nil); err != nil || n != 1 {
		t.Fatalf("unclaim: %d, %v", n, err)
	}
	_, again := claimLeased(t, outboxstore.NewStore(db.Pool), outboxstore.ClaimRequest{Rows: 10, KeyRun: 1, For: time.Minute, Now: &clock})
	if len(again.Messages) != 1 || again.Messages[0].ID != c.Messages[0].ID || again.Deaths != 1 || !again.Isolated ||
		again.Messages[0].Attempt != c.Messages[0].Attempt {
		t.Fatalf("claimed after unclaim: %v deaths %d isolated %v; want row %d again, deaths 1, isolated, attempt %d",
			ids(again), again.Deaths, again.Isolated, c.Messages[0].ID, c.Messages[0].Attempt)
	}
}

// A payload larger than the caller can hold (MaxEventBytes) comes back in Undecodable,
// never copied, with the reason; the rows around it are claimed as usual.
func TestClaimRefusesAnEventOverMaxEventBytes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// ~100 kB of hex digits (Postgres cannot compress them), then two small events.
	outboxtest.Exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload) VALUES
		('test.event', 'big', jsonb_build_object('pad', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 3200) i))),
		('test.event', 'big', '{"n": 2}'), ('test.event', 'other', '{"n": 3}')`)
	s := outboxstore.NewStore(db.Pool)
	_, c := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 10, KeyRun: 4, MaxEventBytes: 50_000})
	if len(c.Undecodable) != 1 || !strings.Contains(c.Undecodable[0].Error, "larger than the relay can hold (50000 bytes") {
		t.Fatalf("refused %+v; want the 100 kB event, larger than the relay can hold", c.Undecodable)
	}
	if len(c.Messages) != 2 || c.Bytes != 2*int64(len(`{"n": 2}`)) {
		t.Fatalf("%d messages, %d bytes; want the two small ones, 16 bytes", len(c.Messages), c.Bytes)
	}
}

// On a schema without migration 0020's column (a relay deployed before `migrate up`) the
// claim runs as before and still claims a row it died holding alone.
func TestClaimWithoutTheDeathsColumn(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	outboxtest.Exec(t, db.Pool, `ALTER TABLE outbox DROP COLUMN relay_deaths`)
	insertReady(t, db, 4, func(i int) string { return fmt.Sprint("k-", i) })
	s := outboxstore.NewStore(db.Pool)
	clock := time.Now()
	if _, c := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 100, KeyRun: 4, For: time.Minute, Now: &clock}); c.Len() != 4 {
		t.Fatalf("first claim took %d rows, want 4", c.Len())
	}
	clock = clock.Add(2 * time.Minute) // that relay died
	if _, c := claimLeased(t, s, outboxstore.ClaimRequest{Rows: 100, KeyRun: 4, For: time.Minute, Now: &clock}); c.Len() != 1 {
		t.Fatalf("claim after the death took %d rows, want one alone", c.Len())
	}
}
