package localstack

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Summary is computed from the database after a run, never from in-memory counters.
type Summary struct {
	Produced int64 `json:"produced"`
	Poison   int64 `json:"poison"`
	// Processed counts events applied at least once; DuplicateEffects counts extra
	// applications (must be 0).
	Processed        int64 `json:"processed"`
	DuplicateEffects int64 `json:"duplicate_effects"`
	// DuplicatesAbsorbed counts redeliveries the consumer recognised and skipped.
	DuplicatesAbsorbed int64 `json:"duplicates_absorbed"`
	DeadLetters        int64 `json:"dead_letters"`
	PoisonDeadLettered int64 `json:"poison_dead_lettered"`
	// Lost: produced, neither applied nor dead-lettered (must be 0).
	Lost int64 `json:"lost"`
	// OrderViolations: applications of a key's event after a later event of that key.
	OrderViolations int64   `json:"order_violations"`
	LatencyP50ms    float64 `json:"latency_ms_p50"`
	LatencyP99ms    float64 `json:"latency_ms_p99"`
	Ordering        string  `json:"ordering"`
	// KeptSchema and KeptURL, with Options.Keep, name the schema left in place and a
	// connection string to it (search_path set, the password shown as "xxxxx").
	KeptSchema string `json:"kept_schema,omitempty"`
	KeptURL    string `json:"kept_url,omitempty"`
}

// OK reports whether nothing was lost, applied twice, or dead-lettered that should not be.
func (s Summary) OK() bool {
	return s.Lost == 0 && s.DuplicateEffects == 0 && s.DeadLetters == s.PoisonDeadLettered
}

const qSummary = `
WITH first_effect AS (
    SELECT outbox_id, min(applied_at) AS applied_at, count(*) AS n FROM demo_effects GROUP BY outbox_id
), dead AS (
    SELECT DISTINCT outbox_id FROM dead_letters WHERE outbox_id IS NOT NULL
), ordered AS (
    SELECT outbox_id, lag(outbox_id) OVER (PARTITION BY partition_key ORDER BY seq) AS prev FROM demo_effects
)
SELECT
    (SELECT count(*) FROM outbox),
    (SELECT count(*) FROM demo_orders WHERE poison),
    (SELECT count(*) FROM first_effect),
    (SELECT coalesce(sum(n - 1), 0) FROM first_effect),
    (SELECT count(*) FROM dead),
    (SELECT count(*) FROM dead d JOIN outbox o ON o.id = d.outbox_id
        JOIN demo_orders od ON od.id = o.payload->>'order_id' WHERE od.poison),
    (SELECT count(*) FROM outbox o
        WHERE NOT EXISTS (SELECT 1 FROM first_effect f WHERE f.outbox_id = o.id)
          AND NOT EXISTS (SELECT 1 FROM dead d WHERE d.outbox_id = o.id)),
    (SELECT count(*) FROM ordered WHERE prev > outbox_id),
    (SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM f.applied_at - o.created_at)), 0) * 1000
        FROM first_effect f JOIN outbox o ON o.id = f.outbox_id),
    (SELECT coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM f.applied_at - o.created_at)), 0) * 1000
        FROM first_effect f JOIN outbox o ON o.id = f.outbox_id)`

// Summarize reads the run's outcome from the database.
func Summarize(ctx context.Context, db *pgxpool.Pool) (Summary, error) {
	var s Summary
	err := db.QueryRow(ctx, qSummary).Scan(&s.Produced, &s.Poison, &s.Processed, &s.DuplicateEffects,
		&s.DeadLetters, &s.PoisonDeadLettered, &s.Lost, &s.OrderViolations, &s.LatencyP50ms, &s.LatencyP99ms)
	if err != nil {
		return s, fmt.Errorf("summarize run: %w", err)
	}
	return s, nil
}

// Progress is one line of the live display.
type Progress struct {
	Produced, Dispatched, Processed, DeadLetters, Backlog int64
	OldestAgeSeconds                                      float64
}

const qProgress = `
SELECT (SELECT count(*) FROM outbox),
       (SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL),
       (SELECT count(DISTINCT outbox_id) FROM demo_effects),
       (SELECT count(*) FROM dead_letters),
       (SELECT count(*) FROM outbox WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL),
       coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM outbox
                 WHERE dispatched_at IS NULL AND dead_lettered_at IS NULL), 0)`

// ReadProgress samples the counters for the progress line.
func ReadProgress(ctx context.Context, db *pgxpool.Pool) (Progress, error) {
	var p Progress
	err := db.QueryRow(ctx, qProgress).Scan(&p.Produced, &p.Dispatched, &p.Processed, &p.DeadLetters, &p.Backlog, &p.OldestAgeSeconds)
	if err != nil {
		return p, fmt.Errorf("read progress: %w", err)
	}
	return p, nil
}
