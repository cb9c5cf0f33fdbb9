package outboxstore

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// The claim's plan must not depend on the table's statistics: a new deployment, a burst
// after a quiet period or a lagging autovacuum leave the outbox unanalysed, or analysed
// while it was empty. Once the locked step chose outbox_ready_idx over the primary key on
// such a table and walked every ready row (1,038 ms instead of 40 for one claim over a
// 190k backlog), and the prefix check joined chosen and locked rows in a nested loop (a
// million comparisons). The plan is checked, not timed: each state must probe only what
// the batch needs.
func TestClaimPlanIgnoresStatistics(t *testing.T) {
	t.Parallel()
	const backlog, keys, batch, keyRun = 60000, 1000, 1000, 8
	for _, state := range []string{"never analysed", "analysed while empty", "analysed", "analysed while drained"} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx := t.Context()
			if state == "analysed while empty" {
				outboxtest.Exec(t, db.Pool, "ANALYZE outbox")
			}
			outboxtest.Exec(t, db.Pool, `INSERT INTO outbox (topic, partition_key, payload, available_at)
SELECT 'test.event', 'k' || (g % `+strconv.Itoa(keys)+`), '{"a":1}', now() - interval '1 hour' + g * interval '1 millisecond'
FROM generate_series(1, `+strconv.Itoa(backlog)+`) g`)
			switch state {
			case "analysed":
				outboxtest.Exec(t, db.Pool, "ANALYZE outbox")
			case "analysed while drained":
				// The steady state: the statistics say nothing is pending, so every
				// pending partial index looks empty; then a backlog builds.
				outboxtest.Exec(t, db.Pool, "UPDATE outbox SET dispatched_at = now()")
				outboxtest.Exec(t, db.Pool, "ANALYZE outbox")
				outboxtest.Exec(t, db.Pool, "UPDATE outbox SET dispatched_at = NULL")
			}
			tx := outboxtest.Begin(t, db.Pool)
			if _, err := tx.Exec(ctx, qClaimPlanner); err != nil {
				t.Fatal(err)
			}
			lease, err := NewLease()
			if err != nil {
				t.Fatal(err)
			}
			// No bounds; pending_from's walk starts at the first id.
			args := claimArgs(batch, lease.Token, nil, "30 seconds", batch, keyRun, int64(1)<<40,
				walkParams{pendingFrom: pgtype.Int8{Int64: 1, Valid: true}, reopened: -1})
			plan := strings.Join(outboxtest.Column[string](t, tx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+qClaim, args), "\n")
			if n := claimedRows(plan); n != batch {
				t.Fatalf("claimed %d rows, want %d:\n%s", n, batch, plan)
			}
			// Every node reads at most a few times the batch: a walk over the backlog
			// (the ready index in the locked step, every key's whole run) shows up as
			// a node with tens of thousands of rows or removed rows.
			for _, m := range regexp.MustCompile(`(?:actual rows=|Rows Removed by (?:Join )?Filter: )(\d+)(?: loops=(\d+))?`).FindAllStringSubmatch(plan, -1) {
				n, _ := strconv.Atoi(m[1])
				if m[2] != "" {
					loops, _ := strconv.Atoi(m[2])
					n *= loops
				}
				if n > 3*batch {
					t.Errorf("a plan node handles %d rows (%q), more than 3 x the batch of %d:\n%s", n, m[0], batch, plan)
					break
				}
			}
			// EXPLAIN shows JIT only with costs.
			var jit bool
			jrows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, TIMING OFF) "+qClaim, args)
			if err != nil {
				t.Fatal(err)
			}
			for jrows.Next() {
				var s string
				if err := jrows.Scan(&s); err != nil {
					t.Fatal(err)
				}
				jit = jit || strings.HasPrefix(s, "JIT:")
			}
			if jrows.Err() != nil {
				t.Fatal(jrows.Err())
			}
			if jit {
				t.Error("the claim was compiled (JIT): its planner settings must keep jit off")
			}
			if locked := cteBody(plan, "locked"); !strings.Contains(locked, "outbox_pkey") || strings.Contains(locked, "outbox_ready_idx") {
				t.Errorf("the locked step must fetch the chosen ids by primary key:\n%s", locked)
			}
		})
	}
}

// claimedRows reads the Update node's row count from an EXPLAIN ANALYZE of qClaim.
func claimedRows(plan string) int {
	m := regexp.MustCompile(`^Update on outbox o \(actual rows=(\d+)`).FindStringSubmatch(plan)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// cteBody is the part of plan under "CTE name", up to the next CTE or InitPlan at the
// same depth.
func cteBody(plan, name string) string {
	i := strings.Index(plan, "CTE "+name+"\n")
	if i < 0 {
		return ""
	}
	rest := plan[i+len("CTE "+name+"\n"):]
	if j := regexp.MustCompile(`\n  (CTE|InitPlan) `).FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest
}
