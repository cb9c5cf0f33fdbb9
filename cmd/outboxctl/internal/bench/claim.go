package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// ClaimConfig sizes the claim-cost scenario.
type ClaimConfig struct {
	// History are the numbers of dispatched rows in the table; Pending the numbers of
	// ready rows on top of them. Every pair is measured.
	History []int `json:"history"`
	Pending []int `json:"pending"`
	// Iterations of claim(Batch) + mark per pair; after each, Batch new events are enqueued
	// so the pending count stays where it was.
	Iterations int `json:"iterations"`
	Batch      int `json:"batch"`
	Keys       int `json:"keys"`
	// Note says how this size differs from the (0, 1M, 5M) x (10k, 200k).
	Note string `json:"note,omitempty"`
}

// ClaimConfigFor returns the claim scenario's size.
func ClaimConfigFor(s Size) ClaimConfig {
	c := ClaimConfig{Iterations: 300, Batch: 100, Keys: 1000}
	switch s {
	case Full:
		c.History, c.Pending = []int{0, 1_000_000, 5_000_000}, []int{10_000, 200_000}
	case Short:
		c.History, c.Pending, c.Iterations = []int{0, 100_000, 500_000}, []int{10_000, 50_000}, 200
		c.Note = "short size: history 0/100k/500k instead of 0/1M/5M and pending 10k/50k instead of 10k/200k; the 5m_vs_0 ratio compares the largest history with none"
	default:
		c.History, c.Pending, c.Iterations, c.Keys = []int{0, 5_000}, []int{500, 2_000}, 30, 100
		c.Note = "tiny size for tests: the ratio compares 5k dispatched rows with none"
	}
	return c
}

// ClaimCase is one (history, pending) measurement.
type ClaimCase struct {
	History int `json:"history"`
	Pending int `json:"pending"`
	// Claim is the latency of Store.Claim (statement + reading the rows).
	Claim Latency `json:"claim"`
	// RowsPerClaim is the mean number of rows a claim returned (Batch when the index works).
	RowsPerClaim float64 `json:"rows_per_claim"`
	// Sizes in bytes after loading and VACUUM ANALYZE.
	TableBytes     int64   `json:"table_bytes"`
	HeapBytes      int64   `json:"heap_bytes"`
	ReadyIdxBytes  int64   `json:"ready_idx_bytes"`
	PkeyBytes      int64   `json:"pkey_bytes"`
	KeyIdxBytes    int64   `json:"pending_key_idx_bytes"`
	LoadSeconds    float64 `json:"load_seconds"`
	Plan           string  `json:"plan"`
	PlanExecMillis float64 `json:"plan_exec_ms"`
	// PlanUsesSeqScan is true when the plan reads the outbox heap sequentially.
	PlanUsesSeqScan bool `json:"plan_uses_seq_scan"`
}

// ClaimResult is the claim scenario's output.
type ClaimResult struct {
	Config ClaimConfig `json:"config"`
	Cases  []ClaimCase `json:"cases"`
	// Statistics is one claim of relay.DefaultBatchSize over the same backlog before the
	// outbox was ever analysed and after ANALYZE.
	Statistics *ClaimStatistics `json:"statistics,omitempty"`
}

// ClaimStatistics compares the claim on a never-analysed table with the same claim after
// ANALYZE (median of Samples claims each, every claim rolled back so the table and its
// missing statistics stay as they were). The claims are a relay's: one Store whose
// first claim, untimed, has learnt its walks' bounds. A Store's first claim finds the
// smallest pending id by reading every pending row (once per process, or per Lambda cold
// start); the first full run that timed a new Store per claim measured mostly that read
// on a cold cache: 259 of 298 ms, never analysed, against 142 ms analysed and warm.
// FirstMs times that first claim, before ANALYZE.
type ClaimStatistics struct {
	Pending        int     `json:"pending"`
	Batch          int     `json:"batch"`
	Samples        int     `json:"samples"`
	UnanalysedMs   float64 `json:"unanalysed_claim_ms"`
	AnalysedMs     float64 `json:"analysed_claim_ms"`
	FirstMs        float64 `json:"first_claim_ms"`
	UnanalysedPlan string  `json:"unanalysed_plan"`
}

// Case returns the case (history, pending), or nil.
func (r *ClaimResult) Case(history, pending int) *ClaimCase {
	if r == nil {
		return nil
	}
	return find(r.Cases, func(c *ClaimCase) bool { return c.History == history && c.Pending == pending })
}

// P99Ratio is claim p99 with the most history over claim p99 with none, at the largest
// pending count: the partial index should keep it near 1.
func (r *ClaimResult) P99Ratio() (float64, bool) {
	if r == nil || len(r.Config.History) < 2 || len(r.Config.Pending) == 0 {
		return 0, false
	}
	p := r.Config.Pending[len(r.Config.Pending)-1]
	lo, hi := r.Case(r.Config.History[0], p), r.Case(r.Config.History[len(r.Config.History)-1], p)
	if lo == nil || hi == nil {
		return 0, false
	}
	return ratio(hi.Claim.P99, lo.Claim.P99), true
}

// Claim measures one claim of Batch rows against growing dispatched history. For each
// history size it loads the history and the smallest pending count with COPY, analyses,
// measures, then tops the pending rows up to the next count, analyses, measures again.
func Claim(ctx context.Context, url string, cfg ClaimConfig, progress func(string)) (*ClaimResult, error) {
	pool, err := openPool(ctx, url, 4)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	res := &ClaimResult{Config: cfg}
	if res.Statistics, err = claimStatistics(ctx, pool, cfg); err != nil {
		return res, err
	}
	if st := res.Statistics; progress != nil && st != nil {
		progress(fmt.Sprintf("claim of %d over %d pending: never analysed %.2f ms, analysed %.2f ms", st.Batch, st.Pending, st.UnanalysedMs, st.AnalysedMs))
	}
	for _, h := range cfg.History {
		if err := Reset(ctx, pool); err != nil {
			return res, err
		}
		loaded := 0
		for _, p := range cfg.Pending {
			t0 := time.Now()
			dispatched := 0
			if loaded == 0 {
				dispatched = h
			}
			if err := LoadRows(ctx, pool, Load{Run: runID("c"), Dispatched: dispatched, Pending: p - loaded, Keys: cfg.Keys}); err != nil {
				return res, err
			}
			if err := Analyze(ctx, pool); err != nil {
				return res, err
			}
			if err := checkpoint(ctx, pool); err != nil {
				return res, err
			}
			loaded = p
			loadTime := time.Since(t0)
			c, err := claimCase(ctx, pool, cfg, h, p)
			if err != nil {
				return res, err
			}
			c.LoadSeconds = round3(loadTime.Seconds())
			res.Cases = append(res.Cases, c)
			if progress != nil {
				progress(fmt.Sprintf("claim history=%-8d pending=%-7d p50 %.2f ms  p99 %.2f ms  (%d samples, %.0f rows/claim, seq scan %v)",
					h, p, c.Claim.P50, c.Claim.P99, c.Claim.Samples, c.RowsPerClaim, c.PlanUsesSeqScan))
			}
		}
	}
	return res, nil
}

// checkpoint writes out the pages the load dirtied, so the claims that follow are timed as
// in a deployment whose history built up over days of checkpoints, not while the backend
// evicts the dirty pages of a bulk load made seconds before (the EXPLAIN of the 5M case
// showed the claim itself writing buffers out). Without the privilege (superuser or
// pg_checkpoint) the claims are timed as they are.
func checkpoint(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, "CHECKPOINT")
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checkpoint after loading: %w", err)
	}
	return nil
}

// claimCase times cfg.Iterations claims on the loaded table and explains the last one.
func claimCase(ctx context.Context, pool *pgxpool.Pool, cfg ClaimConfig, history, pending int) (ClaimCase, error) {
	c := ClaimCase{History: history, Pending: pending}
	if err := pool.QueryRow(ctx, qTableSizes).Scan(&c.TableBytes, &c.HeapBytes, &c.ReadyIdxBytes, &c.PkeyBytes, &c.KeyIdxBytes); err != nil {
		return c, fmt.Errorf("read table sizes: %w", err)
	}
	rec := &recordingQuerier{Querier: pool}
	store := outboxstore.NewStore(rec)
	lats := make([]time.Duration, 0, cfg.Iterations)
	rows := 0
	run := runID("r")
	for i := range cfg.Iterations {
		lease, err := outboxstore.NewLease()
		if err != nil {
			return c, err
		}
		start := time.Now()
		claimed, err := store.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: cfg.Batch, KeyRun: relay.DefaultPublishConcurrency, For: relay.DefaultLease})
		msgs := claimed.Messages
		lats = append(lats, time.Since(start))
		if err != nil {
			return c, err
		}
		rows += len(msgs)
		ids := make([]outbox.ID, len(msgs))
		for j, m := range msgs {
			ids[j] = m.ID
		}
		if _, err := store.MarkDispatched(ctx, lease, ids, nil); err != nil {
			return c, err
		}
		// Producers keep up: put back as many events as were taken, through the real API.
		evs := make([]outbox.Event, len(msgs))
		for j := range evs {
			key := KeyName((i*cfg.Batch + j) % cfg.Keys)
			evs[j] = outbox.Event{Topic: Topic, PartitionKey: key, Payload: Payload(run, i*cfg.Batch+j, key)}
		}
		if _, err := outbox.EnqueueBatch(ctx, pool, evs); err != nil {
			return c, err
		}
	}
	c.Claim = summarise(lats)
	c.RowsPerClaim = round3(float64(rows) / float64(max(cfg.Iterations, 1)))
	plan, err := explainLast(ctx, pool, rec)
	if err != nil {
		return c, err
	}
	c.Plan = plan
	c.PlanUsesSeqScan = strings.Contains(plan, "Seq Scan on outbox")
	c.PlanExecMillis = planExecMillis(plan)
	return c, nil
}

// recordingQuerier remembers the last query Store.Claim ran, so the plan shown is the plan
// of the relay's own statement (not a copy of its text that could drift).
type recordingQuerier struct {
	outbox.Querier
	mu   sync.Mutex
	sql  string
	args []any
}

func (r *recordingQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.mu.Lock()
	r.sql, r.args = sql, args
	r.mu.Unlock()
	return r.Querier.Query(ctx, sql, args...)
}

// explainLast runs EXPLAIN (ANALYZE, BUFFERS) of the last recorded claim with a fresh lease,
// in a transaction that is rolled back, so the claim it executes changes nothing.
func explainLast(ctx context.Context, pool *pgxpool.Pool, rec *recordingQuerier) (string, error) {
	rec.mu.Lock()
	sql, args := rec.sql, append([]any(nil), rec.args...)
	rec.mu.Unlock()
	if sql == "" {
		return "", nil
	}
	lease, err := outboxstore.NewLease()
	if err != nil {
		return "", err
	}
	if len(args) > 1 {
		args[1] = lease.Token
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("begin explain: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	return strings.Join(lines, "\n"), nil
}

func planExecMillis(plan string) float64 {
	for _, l := range strings.Split(plan, "\n") {
		var ms float64
		if _, err := fmt.Sscanf(strings.TrimSpace(l), "Execution Time: %f ms", &ms); err == nil {
			return ms
		}
	}
	return 0
}

// claimStatistics times the relay's claim over the scenario's largest pending count on a
// table that has never been analysed (a new deployment, or autovacuum behind a burst:
// issue 28 measured 1,038 ms against 40 there), then after ANALYZE. Every claim runs in a
// transaction that is rolled back, so all of them see the same rows; the load and the
// claims take seconds, well inside autovacuum's one-minute nap, so its analyse does not
// run in between on a cluster with the defaults.
func claimStatistics(ctx context.Context, pool *pgxpool.Pool, cfg ClaimConfig) (*ClaimStatistics, error) {
	st := &ClaimStatistics{Pending: cfg.Pending[len(cfg.Pending)-1], Batch: relay.DefaultBatchSize, Samples: 5}
	if err := Reset(ctx, pool); err != nil {
		return nil, err
	}
	// TRUNCATE keeps the statistics an earlier run left; only a new table has none.
	if _, err := pool.Exec(ctx, qForgetOutboxStatistics); err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return nil, nil // only a superuser can forget statistics: the comparison is skipped
		}
		return nil, fmt.Errorf("forget outbox statistics: %w", err)
	}
	if err := LoadRows(ctx, pool, Load{Run: runID("s"), Pending: st.Pending, Keys: cfg.Keys}); err != nil {
		return nil, err
	}
	var err error
	if st.UnanalysedMs, st.FirstMs, st.UnanalysedPlan, err = medianClaim(ctx, pool, st.Batch, st.Samples); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "ANALYZE outbox"); err != nil {
		return nil, fmt.Errorf("analyze outbox: %w", err)
	}
	if st.AnalysedMs, _, _, err = medianClaim(ctx, pool, st.Batch, st.Samples); err != nil {
		return nil, err
	}
	return st, Reset(ctx, pool)
}

// medianClaim runs a first claim, then n more, of batch rows on one Store, each rolled
// back, and returns the n claims' median time in ms, the first claim's, and the plan of
// one more, explained.
func medianClaim(ctx context.Context, pool *pgxpool.Pool, batch, n int) (median, first float64, plan string, err error) {
	lats := make([]time.Duration, 0, n+1)
	rec := &recordingQuerier{}
	store := outboxstore.NewStore(rec)
	for range n + 1 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return 0, 0, "", fmt.Errorf("begin claim: %w", err)
		}
		rec.Querier = tx
		lease, err := outboxstore.NewLease()
		if err == nil {
			start := time.Now()
			_, err = store.Claim(ctx, outboxstore.ClaimRequest{Lease: lease, Rows: batch, KeyRun: relay.DefaultPublishConcurrency, For: relay.DefaultLease})
			lats = append(lats, time.Since(start))
		}
		_ = tx.Rollback(ctx)
		if err != nil {
			return 0, 0, "", err
		}
	}
	plan, err = explainLast(ctx, pool, rec)
	return summarise(lats[1:]).P50, float64(lats[0].Microseconds()) / 1000, plan, err
}
