package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// seedCauses writes 1,000 dead letters from three causes, each through another writer, with
// errors that differ only in ids, numbers, hex, UUIDs and timestamps:
//
//	relay:     400 letters, topic order.created, written as the relay writes them
//	delivery:  350 letters, topic order.created, HTTP 500, through Record (failure callback)
//	handmade:  250 letters, topic invoice.paid, HTTP 489, a plain INSERT
//
// It returns each cause's outbox ids.
func seedCauses(t *testing.T, db *pgtest.DB) (relay, delivery, handmade []int64) {
	t.Helper()
	ctx := context.Background()
	insertRows := func(topic string, n int, deadLettered bool) []int64 {
		rows, err := db.Pool.Query(ctx, `
INSERT INTO outbox (topic, partition_key, payload, dispatched_at, dead_lettered_at)
SELECT $1, 'k-' || i, jsonb_build_object('n', i), CASE WHEN $3 THEN NULL ELSE now() END, CASE WHEN $3 THEN now() END
FROM generate_series(1, $2::int) i
RETURNING id`, topic, n, deadLettered)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}

	relay = insertRows("order.created", 400, true)
	_, err := db.Pool.Exec(ctx, `
INSERT INTO dead_letters (source, outbox_id, topic, partition_key, payload, error, attempts)
SELECT 'relay', o.id, o.topic, o.partition_key, o.payload,
       format('publish outbox %s at %s: qstash request %s (trace 0x%s, key %s) answered 400: body of %s bytes exceeds 1048576',
              o.id, to_char(now() - o.id * interval '1 second', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
              md5(o.id::text)::uuid, to_hex(o.id * 7919), 'msg_' || substr(md5('k' || o.id), 1, 22), 1048576 + o.id),
       12
FROM outbox o WHERE o.id = ANY($1)`, relay)
	if err != nil {
		t.Fatal(err)
	}

	delivery = insertRows("order.created", 350, false)
	for i, id := range delivery {
		f := failure(id, fmt.Sprintf("msg_%026d", id))
		f.Status, f.Retried = 500, i%4 // "after 0 of 3 retries" ... "after 3 of 3 retries"
		if _, err := deadletter.Record(ctx, db.Pool, f); err != nil {
			t.Fatal(err)
		}
	}

	handmade = insertRows("invoice.paid", 250, true)
	_, err = db.Pool.Exec(ctx, `
INSERT INTO dead_letters (source, outbox_id, topic, error, status_code, created_at)
SELECT 'delivery', o.id, o.topic,
       format(E'handler rejected invoice inv-%s for order %s:\n amount %s.%s EUR over limit since %s',
              o.id, gen_random_uuid(), o.id * 3, o.id % 100, to_char(now(), 'HH24:MI:SS')),
       489, now() - o.id * interval '1 minute'
FROM outbox o WHERE o.id = ANY($1)`, handmade)
	if err != nil {
		t.Fatal(err)
	}
	return relay, delivery, handmade
}

func TestGroupsThreeCausesAndRedriveOneGroup(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	relay, delivery, handmade := seedCauses(t, db)

	groups, err := deadletter.Groups(ctx, db.Pool, deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 3 {
		t.Fatalf("got %d groups, want 3: %+v", len(groups), groups)
	}
	want := []struct {
		source, topic string
		status        int
		count         int64
		pattern       string
	}{
		{"relay", "order.created", 0, 400, "publish outbox <n> at <time>: qstash request <uuid> (trace <hex>, key <id>) answered <n>: body of <n> bytes exceeds <n>"},
		{"delivery", "order.created", 500, 350, "qstash delivery failed: HTTP <n> after <n> of <n> retries"},
		{"delivery", "invoice.paid", 489, 250, "handler rejected invoice inv-<n> for order <uuid>: amount <n> EUR over limit since <time>"},
	}
	for i, w := range want {
		g := groups[i] // largest first
		if g.Source != w.source || g.Topic != w.topic || g.StatusCode != w.status || g.Count != w.count || g.Open != w.count || g.ErrorPattern != w.pattern {
			t.Errorf("group %d = %+v\nwant %+v", i, g, w)
		}
		if deadletter.ValidFingerprint(g.Fingerprint) != nil || g.FirstSeen.After(g.LastSeen) || g.SampleError == "" || g.SampleID == 0 {
			t.Errorf("group %d fingerprint/first/last/sample: %+v", i, g)
		}
	}
	byCause := map[string][]int64{groups[0].Fingerprint: relay, groups[1].Fingerprint: delivery, groups[2].Fingerprint: handmade}
	if len(byCause) != 3 {
		t.Fatalf("fingerprints not distinct: %+v", groups)
	}
	// Every letter carries its group's fingerprint, whoever wrote it.
	for fp, ids := range byCause {
		if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE fingerprint = $1 AND outbox_id = ANY($2)`, fp, ids); n != len(ids) {
			t.Errorf("group %s has %d of its %d letters", fp, n, len(ids))
		}
	}

	// Filters narrow the letters before grouping; GetGroup reads one group.
	gs, err := deadletter.Groups(ctx, db.Pool, deadletter.Filter{Topic: "invoice.paid"})
	if err != nil || len(gs) != 1 || gs[0].Fingerprint != groups[2].Fingerprint {
		t.Fatalf("groups of invoice.paid: %+v %v", gs, err)
	}
	if gs, err := deadletter.Groups(ctx, db.Pool, deadletter.Filter{Limit: 2}); err != nil || len(gs) != 2 {
		t.Fatalf("limit 2: %d groups %v", len(gs), err)
	}
	g, err := deadletter.GetGroup(ctx, db.Pool, groups[1].Fingerprint, deadletter.Filter{})
	if err != nil || g != groups[1] {
		t.Fatalf("GetGroup = %+v, %v; want %+v", g, err, groups[1])
	}
	if _, err := deadletter.GetGroup(ctx, db.Pool, "0123456789abcdef", deadletter.Filter{}); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("unknown group: %v", err)
	}
	if _, err := deadletter.GetGroup(ctx, db.Pool, "0123", deadletter.Filter{}); !errors.Is(err, deadletter.ErrBadFingerprint) {
		t.Fatalf("short fingerprint: %v", err)
	}

	// The dry run names exactly the group's letters and changes nothing.
	target := groups[1].Fingerprint
	plan, err := deadletter.Plan(ctx, db.Pool, deadletter.Filter{Fingerprint: target})
	if err != nil {
		t.Fatal(err)
	}
	if got := outboxIDs(plan.Redriven); !slices.Equal(got, sorted(delivery)) || len(plan.AlreadyPending)+len(plan.OutboxMissing) != 0 {
		t.Fatalf("plan redrives %d rows, want the %d of the group", len(got), len(delivery))
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox WHERE generation <> 0`); n != 0 {
		t.Fatalf("dry run changed %d rows", n)
	}

	res, err := deadletter.Redrive(ctx, db.Pool, deadletter.Filter{Fingerprint: target}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := outboxIDs(res.Redriven); !slices.Equal(got, sorted(delivery)) {
		t.Fatalf("redrove %d rows, want the %d of the group", len(got), len(delivery))
	}
	// Exactly the group's rows are pending again with a new generation; the others are not.
	if n := db.Count(t, `SELECT count(*) FROM outbox WHERE generation = 1 AND dispatched_at IS NULL AND dead_lettered_at IS NULL AND id = ANY($1)`, delivery); n != len(delivery) {
		t.Fatalf("%d of %d group rows reset", n, len(delivery))
	}
	if n := db.Count(t, `SELECT count(*) FROM outbox WHERE generation <> 0 AND NOT id = ANY($1)`, delivery); n != 0 {
		t.Fatalf("%d rows outside the group were reset", n)
	}
	if n := db.Count(t, `SELECT count(*) FROM dead_letters WHERE resolved_at IS NOT NULL`); n != len(delivery) {
		t.Fatalf("%d letters resolved, want %d", n, len(delivery))
	}
	groups, err = deadletter.Groups(ctx, db.Pool, deadletter.Filter{})
	if err != nil || len(groups) != 2 || groups[0].Fingerprint == target || groups[1].Fingerprint == target {
		t.Fatalf("open groups after the redrive: %+v %v", groups, err)
	}
	// With resolved letters included, the redriven group is back, with no open letter.
	all, err := deadletter.Groups(ctx, db.Pool, deadletter.Filter{IncludeResolved: true})
	if err != nil || len(all) != 3 {
		t.Fatalf("groups with resolved: %+v %v", all, err)
	}
	for _, g := range all {
		if g.Fingerprint == target && (g.Count != int64(len(delivery)) || g.Open != 0) {
			t.Fatalf("redriven group %+v", g)
		}
	}
	// The listing shows each letter's fingerprint.
	ls, err := deadletter.List(ctx, db.Pool, deadletter.Filter{Fingerprint: groups[0].Fingerprint, Limit: 1000})
	if err != nil || len(ls) != int(groups[0].Count) || ls[0].Fingerprint != groups[0].Fingerprint {
		t.Fatalf("list by fingerprint: %d letters %v", len(ls), err)
	}
}

func outboxIDs(rs []deadletter.Redriven) []int64 {
	ids := make([]int64, 0, len(rs))
	for _, r := range rs {
		ids = append(ids, int64(r.OutboxID))
	}
	return sorted(ids)
}

func sorted(ids []int64) []int64 {
	s := slices.Clone(ids)
	slices.Sort(s)
	return s
}

// TestErrorPattern pins the normalisation: what varies between occurrences of one cause
// becomes a placeholder, what names the cause stays.
func TestErrorPattern(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for in, want := range map[string]string{
		"qstash delivery failed: HTTP 500 after 3 of 3 retries":                         "qstash delivery failed: HTTP <n> after <n> of <n> retries",
		"row 7f3c2a10-9B1E-4c3d-8e2f-0123456789ab at 2026-12-03T07:31:21.123+01:00 ok":  "row <uuid> at <time> ok",
		"since 2026-12-03 and 2026-12-03 07:31 and 07:31:21.5":                          "since <time> and <time> and <time>",
		"lease 0xDEADBEEF hash deadbeef12 word deadbeef token msg_26hZCxZCuWyyTWPmSVBr": "lease <hex> hash <hex> word deadbeef token <id>",
		"timeout after 1.5s on 10.0.3.17:5432":                                          "timeout after <n>s on <n>.<n>:<n>",
		"  two\n\tlines  ":                                                              "two lines",
		"connection refused":                                                            "connection refused",
	} {
		var got string
		if err := db.Pool.QueryRow(context.Background(), `SELECT dead_letter_error_pattern($1)`, in).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("pattern(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestFingerprintParts: topic, source and status code separate groups with the same error.
func TestFingerprintParts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Pool.Exec(context.Background(), `
INSERT INTO dead_letters (source, topic, status_code, error) VALUES
    ('delivery', 'a', 500, 'boom 1'), ('delivery', 'a', 500, 'boom 2'), -- one group
    ('delivery', 'b', 500, 'boom 3'),  -- other topic
    ('relay',    'a', 500, 'boom 4'),  -- other source
    ('delivery', 'a', 503, 'boom 5'),  -- other status
    ('delivery', 'a', NULL, 'boom 6'), -- no status
    ('delivery', NULL, 500, 'boom 7')  -- no topic`)
	if err != nil {
		t.Fatal(err)
	}
	if n := db.Count(t, `SELECT count(DISTINCT fingerprint) FROM dead_letters`); n != 6 {
		t.Fatalf("%d fingerprints, want 6", n)
	}
	// A row's fingerprint follows its error when that is corrected by hand.
	var before, after string
	if err := db.Pool.QueryRow(context.Background(), `SELECT fingerprint FROM dead_letters WHERE error = 'boom 3'`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(context.Background(), `UPDATE dead_letters SET topic = 'a' WHERE error = 'boom 3' RETURNING fingerprint`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if before == after || db.Count(t, `SELECT count(*) FROM dead_letters WHERE fingerprint = $1`, after) != 3 {
		t.Fatalf("fingerprint not recomputed: %s -> %s", before, after)
	}
}

func TestValidFingerprint(t *testing.T) {
	t.Parallel()
	for fp, ok := range map[string]bool{
		"0123456789abcdef": true, "0123456789ABCDEF": false, "0123456789abcde": false,
		"0123456789abcdef0": false, "0123456789abcdeg": false, "": false,
	} {
		if err := deadletter.ValidFingerprint(fp); (err == nil) != ok {
			t.Errorf("ValidFingerprint(%q) = %v", fp, err)
		}
	}
}
