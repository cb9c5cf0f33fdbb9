package console

import (
	"context"
	"fmt"
	"html/template"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// chartRange is one choice of the overview's time window.
type chartRange struct {
	Name   string
	Span   time.Duration
	Bucket time.Duration
}

// chartRanges are the windows the overview offers; the first is the default. Any other
// value of ?range= falls back to it, so the parameter never reaches a statement.
var chartRanges = []chartRange{
	{"3h", 3 * time.Hour, time.Minute},
	{"1h", time.Hour, time.Minute},
	{"6h", 6 * time.Hour, 2 * time.Minute},
	{"24h", 24 * time.Hour, 10 * time.Minute},
}

func pickRange(name string) chartRange {
	for _, r := range chartRanges {
		if r.Name == name {
			return r
		}
	}
	return chartRanges[0]
}

// Series is the overview chart's data: one value per bucket, oldest first; the last
// bucket ends now.
type Series struct {
	Start  time.Time
	Now    time.Time
	Bucket time.Duration
	// Pending is the number of pending events at the end of each bucket.
	Pending []int64
	// OldestAge is the age of the oldest pending event at the end of each bucket (0: none).
	OldestAge []time.Duration
	// Dispatched is the number of events dispatched during each bucket, per minute.
	Dispatched []float64
	// DeadLettered is the number of events dead-lettered during each bucket (still open).
	DeadLettered []int64
}

// chartRow kinds (qChartPending, qChartDispatched).
const (
	kindPending = iota
	kindDispatched
	kindDeadLettered
	kindOldestPending
)

// chartRow is one group of qChartPending or qChartDispatched.
type chartRow struct {
	Kind       int32
	Created    time.Time  // bucket the rows became pending in
	Done       *time.Time // bucket they left the backlog in; nil while pending
	Count      int64
	MinCreated time.Time
}

// querier is what the chart reads through: pgx.Tx, *pgxpool.Pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func chartRows(ctx context.Context, db querier, q string, start time.Time, bucket time.Duration) ([]chartRow, error) {
	rows, err := db.Query(ctx, q, pgx.QueryExecModeExec, start, bucket)
	if err != nil {
		return nil, fmt.Errorf("query chart: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chartRow, error) {
		var r chartRow
		return r, row.Scan(&r.Kind, &r.Created, &r.Done, &r.Count, &r.MinCreated)
	})
	if err != nil {
		return nil, fmt.Errorf("query chart: %w", err)
	}
	return out, nil
}

// bucketValues are one bucket's raw figures: what Series shows, before the per-minute
// rate and the age (which depend on the bucket's end).
type bucketValues struct {
	Pending      int64     // pending at the bucket's end
	Oldest       time.Time // created_at of the oldest of them; zero when none
	Dispatched   int64     // dispatched during the bucket
	DeadLettered int64     // dead-lettered during the bucket (still open)
}

// readBuckets reads the n buckets from start on (the last one ends at or after now), in
// the snapshot of db, given the number of rows pending in that snapshot (the report's).
// Pending at a time t counts every row created by t and not yet dispatched or
// dead-lettered at t: the rows still pending, plus those that left the backlog since
// start (rows that left it before cannot have been pending after start). Events redriven
// since start count as pending since their creation: the history of a redrive is not kept.
func readBuckets(ctx context.Context, db querier, start time.Time, bucket time.Duration, n int, pendingNow int64) ([]bucketValues, error) {
	var rows []chartRow
	for _, q := range []string{qChartPending, qChartDispatched} {
		part, err := chartRows(ctx, db, q, start, bucket)
		if err != nil {
			return nil, err
		}
		rows = append(rows, part...)
	}
	// The rows pending since before start: the pending count less those created since,
	// all pending through every bucket, the oldest of them the oldest pending row.
	before := pendingNow
	var oldest time.Time
	for _, r := range rows {
		switch r.Kind {
		case kindPending:
			before -= r.Count
		case kindOldestPending:
			oldest = r.MinCreated
		}
	}
	if before > 0 && !oldest.IsZero() {
		rows = append(rows, chartRow{Kind: kindPending, Created: start.Add(-bucket), Count: before, MinCreated: oldest})
	}

	out := make([]bucketValues, n)
	diff := make([]int64, n+1)
	// index turns a bucket start into its index: -1 before start.
	index := func(t time.Time) int { return max(int(t.Sub(start)/bucket), -1) }
	for _, r := range rows {
		if r.Kind == kindOldestPending {
			continue
		}
		end := n // still pending: pending through the last bucket
		if r.Done != nil {
			doneAt := index(*r.Done)
			end = min(doneAt, n)
			if doneAt >= 0 && doneAt < n {
				switch r.Kind {
				case kindDispatched:
					out[doneAt].Dispatched += r.Count
				case kindDeadLettered:
					out[doneAt].DeadLettered += r.Count
				}
			}
		}
		from := max(index(r.Created), 0)
		if from >= end {
			continue // created and gone within one bucket, or created after now (clock skew)
		}
		diff[from] += r.Count
		diff[end] -= r.Count
		for i := from; i < end; i++ {
			if out[i].Oldest.IsZero() || r.MinCreated.Before(out[i].Oldest) {
				out[i].Oldest = r.MinCreated
			}
		}
	}
	var run int64
	for i := range n {
		run += diff[i]
		out[i].Pending = run
	}
	return out, nil
}

// loadSeries reads the window of rg ending at now, every bucket from the database.
func loadSeries(ctx context.Context, db querier, rg chartRange, now time.Time, pendingNow int64) (Series, error) {
	return (*chartCache)(nil).series(ctx, db, rg, now, pendingNow)
}

// chartSettle is how long after its end a bucket's figures are taken as final and cached.
// created_at is the producer transaction's start and dispatched_at the mark statement's,
// so a bucket still changes while transactions that began in it commit; a producer
// transaction open longer than this adds rows to a bucket already cached, which show once
// the entry expires (chartCacheTTL).
const chartSettle = 2 * time.Minute

// chartCacheTTL bounds how long a cached bucket is used: what changes a finished bucket
// (a redrive outside this console, a long producer transaction) shows within it.
const chartCacheTTL = 10 * time.Minute

// chartCache keeps the figures of finished buckets, per bucket width, so a page reads
// only the buckets since the last cached one: the minutes since the last visit, not the
// whole window's dispatches and backlog. The nil cache caches nothing.
type chartCache struct {
	mu      sync.Mutex
	buckets map[chartKey]cachedBucket
}

type chartKey struct {
	width time.Duration
	start int64 // bucket start, Unix microseconds
}

type cachedBucket struct {
	v      bucketValues
	stored time.Time
}

// reset forgets every cached bucket (after a redrive: redriven events count as pending
// since their creation).
func (c *chartCache) reset() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.buckets)
}

// cached returns the values of the contiguous run of cached buckets from start on.
func (c *chartCache) cached(start time.Time, bucket time.Duration, n int, now time.Time) []bucketValues {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []bucketValues
	for i := range n {
		b, ok := c.buckets[chartKey{bucket, start.Add(time.Duration(i) * bucket).UnixMicro()}]
		if !ok || now.Sub(b.stored) > chartCacheTTL {
			break
		}
		out = append(out, b.v)
	}
	return out
}

// store caches the buckets from start on that ended chartSettle before now, and drops
// the buckets older than the oldest window can show.
func (c *chartCache) store(start time.Time, bucket time.Duration, vals []bucketValues, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buckets == nil {
		c.buckets = map[chartKey]cachedBucket{}
	}
	for i, v := range vals {
		b := start.Add(time.Duration(i) * bucket)
		if b.Add(bucket).After(now.Add(-chartSettle)) {
			break
		}
		c.buckets[chartKey{bucket, b.UnixMicro()}] = cachedBucket{v: v, stored: now}
	}
	horizon := now.Add(-chartRanges[len(chartRanges)-1].Span - time.Hour).UnixMicro()
	for k, b := range c.buckets {
		if k.start < horizon || now.Sub(b.stored) > chartCacheTTL {
			delete(c.buckets, k)
		}
	}
}

// series returns the window of rg ending at now: the cached buckets, then the rest read
// from db in one snapshot with pendingNow (the report's pending count, same snapshot).
func (c *chartCache) series(ctx context.Context, db querier, rg chartRange, now time.Time, pendingNow int64) (Series, error) {
	n := int(rg.Span / rg.Bucket)
	start := now.Truncate(rg.Bucket).Add(-time.Duration(n-1) * rg.Bucket)
	vals := c.cached(start, rg.Bucket, n, now)
	k := len(vals)
	if k < n {
		tailStart := start.Add(time.Duration(k) * rg.Bucket)
		tail, err := readBuckets(ctx, db, tailStart, rg.Bucket, n-k, pendingNow)
		if err != nil {
			return Series{}, err
		}
		c.store(tailStart, rg.Bucket, tail, now)
		vals = append(vals, tail...)
	}
	s := Series{Start: start, Now: now, Bucket: rg.Bucket, Pending: make([]int64, n), OldestAge: make([]time.Duration, n),
		Dispatched: make([]float64, n), DeadLettered: make([]int64, n)}
	perMinute := rg.Bucket.Minutes()
	for i, v := range vals {
		s.Pending[i] = v.Pending
		s.Dispatched[i] = float64(v.Dispatched) / perMinute
		s.DeadLettered[i] = v.DeadLettered
		if !v.Oldest.IsZero() {
			end := start.Add(time.Duration(i+1) * rg.Bucket)
			if end.After(now) {
				end = now
			}
			s.OldestAge[i] = max(end.Sub(v.Oldest), 0)
		}
	}
	return s, nil
}

// Chart geometry, in SVG user units.
const (
	chartWidth  = 960
	panelHeight = 110
	panelGap    = 34
	plotLeft    = 70
	plotRight   = 12
)

// panel is one line of the chart.
type panel struct {
	title  string
	class  string
	values []float64
	label  func(float64) string
}

// renderChart draws the series as three stacked panels sharing the time axis. Only
// presentation attributes and classes are used (the CSP has no 'unsafe-inline').
func renderChart(s Series) template.HTML {
	pending := make([]float64, len(s.Pending))
	ages := make([]float64, len(s.OldestAge))
	for i := range s.Pending {
		pending[i] = float64(s.Pending[i])
		ages[i] = s.OldestAge[i].Seconds()
	}
	panels := []panel{
		{"pending events", "pending", pending, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
		{"oldest pending age", "age", ages, func(v float64) string { return ageLabel(time.Duration(v * float64(time.Second))) }},
		{"dispatched per minute", "dispatched", s.Dispatched, func(v float64) string { return fmt.Sprintf("%.0f", v) }},
	}
	height := len(panels)*(panelHeight+panelGap) + 10
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="overview-chart" viewBox="0 0 %d %d" role="img" data-buckets="%d" data-bucket-seconds="%.0f">`,
		chartWidth, height, len(s.Pending), s.Bucket.Seconds())
	fmt.Fprintf(&b, `<title>pending events, oldest pending age and dispatches per minute from %s to %s (UTC)</title>`,
		s.Start.UTC().Format("15:04"), s.Now.UTC().Format("15:04"))
	plotW := float64(chartWidth - plotLeft - plotRight)
	n := len(s.Pending)
	x := func(i int) float64 {
		if n <= 1 {
			return plotLeft
		}
		return plotLeft + plotW*float64(i)/float64(n-1)
	}
	for p, pn := range panels {
		top := float64(p*(panelHeight+panelGap) + 22)
		peak := 0.0
		for _, v := range pn.values {
			peak = math.Max(peak, v)
		}
		scale := niceCeil(peak)
		y := func(v float64) float64 { return top + panelHeight - panelHeight*v/scale }
		fmt.Fprintf(&b, `<g class="panel panel-%s" data-series="%s" data-points="%d" data-max="%g">`, pn.class, pn.class, len(pn.values), peak)
		fmt.Fprintf(&b, `<text class="panel-title" x="%d" y="%.0f">%s</text>`, plotLeft, top-7, pn.title)
		fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, plotLeft, top+panelHeight, chartWidth-plotRight, top+panelHeight)
		fmt.Fprintf(&b, `<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, plotLeft, top, chartWidth-plotRight, top)
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%.1f" text-anchor="end">%s</text>`, plotLeft-6, top+4, pn.label(scale))
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%.1f" text-anchor="end">0</text>`, plotLeft-6, top+panelHeight+4)
		if n > 0 {
			var pts strings.Builder
			fmt.Fprintf(&pts, "%.1f,%.1f", x(0), top+panelHeight)
			for i, v := range pn.values {
				fmt.Fprintf(&pts, " %.1f,%.1f", x(i), y(v))
			}
			fmt.Fprintf(&pts, " %.1f,%.1f", x(n-1), top+panelHeight)
			fmt.Fprintf(&b, `<polygon class="area" points="%s"/>`, pts.String())
			last := pn.values[n-1]
			fmt.Fprintf(&b, `<text class="now" x="%d" y="%.0f" text-anchor="end">now %s</text>`, chartWidth-plotRight, top-7, pn.label(last))
		}
		b.WriteString(`</g>`)
	}
	// Time ticks under the last panel: about six, on bucket boundaries.
	axisY := float64(len(panels)*(panelHeight+panelGap)) - panelGap + 22 + 16
	step := max(n/6, 1)
	for i := 0; i < n; i += step {
		t := s.Start.Add(time.Duration(i) * s.Bucket).UTC()
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.0f" text-anchor="middle">%s</text>`, x(i), axisY, t.Format("15:04"))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built from numbers and fixed text only
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v <= 0), for an axis top.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// ageLabel renders a duration compactly for an axis: 45s, 12m, 3.5h.
func ageLabel(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%.0fm", d.Minutes())
	default:
		return fmt.Sprintf("%.1fh", d.Hours())
	}
}
