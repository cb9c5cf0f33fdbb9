package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
)

// Size picks a scenario's scale.
type Size string

const (
	// Tiny runs in seconds; tests use it so the bench code cannot rot.
	Tiny Size = "tiny"
	// Short runs every scenario in under two minutes on a 2-core machine.
	Short Size = "short"
	// Full is the size of the published numbers.
	Full Size = "full"
)

// ParseSize accepts tiny, short or full.
func ParseSize(s string) (Size, error) {
	switch Size(s) {
	case Tiny, Short, Full:
		return Size(s), nil
	}
	return "", fmt.Errorf("unknown bench size %q: want tiny, short or full", s)
}

// openPool opens a pool of at most maxConns connections and checks that the database
// answers.
func openPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	return awsenv.NewPool(ctx, url, awsenv.PoolConfig{MaxConns: maxConns, MustConnect: true})
}

// Topic is the topic of every generated event; the webhook's example handler serves it.
const Topic = "order.created"

// Payload returns the ~300-byte order.created JSON of event n of partition key key. It is
// a valid payload for orders.OrderCreated (order_id unique per n and run) and carries the
// key so a receiver can check per-key order without a lookup.
func Payload(run string, n int, key string) []byte {
	b := make([]byte, 0, 320)
	b = append(b, `{"order_id":"`...)
	b = append(b, run...)
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `","amount_cents":`...)
	b = strconv.AppendInt(b, int64(100+n%9900), 10)
	b = append(b, `,"currency":"EUR","key":"`...)
	b = append(b, key...)
	b = append(b, `","customer":{"email":"customer-`...)
	b = strconv.AppendInt(b, int64(n%100000), 10)
	b = append(b, `@example.com","tier":"gold"},"items":[{"sku":"SKU-`...)
	b = strconv.AppendInt(b, int64(n%7919), 10)
	b = append(b, `","qty":2,"price_cents":1999},{"sku":"SKU-`...)
	b = strconv.AppendInt(b, int64(n%104729), 10)
	b = append(b, `","qty":1,"price_cents":4999}],"shipping":{"street":"1 Long Example Street","city":"Amsterdam","postcode":"1011AB","country":"NL"},"source":"bench"}`...)
	return b
}

// KeyName is the partition key of key index k.
func KeyName(k int) string { return "key-" + strconv.Itoa(k) }

// Load describes rows to COPY into the outbox.
type Load struct {
	// Run prefixes order ids so loads into one schema never collide.
	Run string
	// Dispatched rows are history: older ids and timestamps, dispatched_at set.
	Dispatched int
	// Pending rows are ready now, keys round-robin over Keys, available_at rising with id.
	Pending int
	Keys    int
}

// LoadRows COPYs l's rows into outbox (dispatched first, so they have the older ids).
func LoadRows(ctx context.Context, db *pgxpool.Pool, l Load) error {
	if l.Keys < 1 {
		l.Keys = 1
	}
	now := time.Now()
	total := l.Dispatched + l.Pending
	// History lies in the past; pending rows became ready during the last minute, in id order.
	histStart := now.Add(-time.Duration(l.Dispatched+1) * time.Millisecond).Add(-time.Hour)
	pendStart := now.Add(-time.Minute)
	step := time.Minute / time.Duration(max(l.Pending, 1))
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= total {
			return nil, nil
		}
		n := i
		i++
		key := KeyName(n % l.Keys)
		if n < l.Dispatched {
			at := histStart.Add(time.Duration(n) * time.Millisecond)
			return []any{Topic, key, Payload(l.Run, n, key), at, at, at.Add(time.Second)}, nil
		}
		at := pendStart.Add(time.Duration(n-l.Dispatched) * step)
		return []any{Topic, key, Payload(l.Run, n, key), at, at, nil}, nil
	})
	_, err := db.CopyFrom(ctx, pgx.Identifier{"outbox"},
		[]string{"topic", "partition_key", "payload", "created_at", "available_at", "dispatched_at"}, src)
	if err != nil {
		return fmt.Errorf("copy outbox rows: %w", err)
	}
	return nil
}

// Reset empties the tables a scenario writes and restarts the outbox ids.
func Reset(ctx context.Context, db *pgxpool.Pool) error {
	if err := orders.Migrate(ctx, db); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, qReset); err != nil {
		return fmt.Errorf("reset bench tables: %w", err)
	}
	return nil
}

// Analyze runs VACUUM ANALYZE on the outbox, as autovacuum would have before a real drain.
func Analyze(ctx context.Context, db *pgxpool.Pool) error {
	if _, err := db.Exec(ctx, qVacuumOutbox); err != nil {
		return fmt.Errorf("vacuum analyze outbox: %w", err)
	}
	return nil
}

// walPosition returns the server's WAL insert position in bytes.
func walPosition(ctx context.Context, db *pgxpool.Pool) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, qWALPosition).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the WAL position: %w", err)
	}
	return n, nil
}

// pendingCount counts rows neither dispatched nor dead-lettered.
func pendingCount(ctx context.Context, db *pgxpool.Pool) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, qPendingCount).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending outbox rows: %w", err)
	}
	return n, nil
}

// Latency summarises samples in milliseconds.
type Latency struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P95     float64 `json:"p95_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
	Mean    float64 `json:"mean_ms"`
}

// summarise sorts ds and returns its percentiles (nearest rank).
func summarise(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Latency{
		Samples: len(s), P50: ms(rank(0.50)), P95: ms(rank(0.95)), P99: ms(rank(0.99)),
		Max: ms(s[len(s)-1]), Mean: ms(sum / time.Duration(len(s))),
	}
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// ratio returns a/b rounded, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round3(a / b)
}

// rate is events per second, rounded to a whole event.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return math.Round(float64(n) / d.Seconds())
}

// runID names one load, for unique order ids.
func runID(prefix string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
