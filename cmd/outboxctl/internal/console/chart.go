package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"math"
	"slices"
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

// chartRow kinds (qChart).
const (
	kindPending = iota
	kindDispatched
	kindDeadLettered
)

// chartRow is one group of qChartPending or qChartDispatched.
type chartRow struct {
	Kind       int32
	Created    time.Time  // bucket the rows became pending in
	Done       *time.Time // bucket they left the backlog in; nil while pending
	Count      int64
	MinCreated time.Time
}

func chartRows(ctx context.Context, db DB, q string, start time.Time, bucket time.Duration) ([]chartRow, error) {
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

// loadSeries reads the window ending at now and rebuilds the three series. Pending at a
// time t counts every row created by t and not yet dispatched or dead-lettered at t: the
// rows still pending, plus those that left the backlog inside the window (rows that left it
// before the window cannot have been pending in it). Events redriven inside the window
// count as pending since their creation: the history of a redrive is not kept.
func loadSeries(ctx context.Context, db DB, rg chartRange, now time.Time) (Series, error) {
	n := int(rg.Span / rg.Bucket)
	start := now.Truncate(rg.Bucket).Add(-time.Duration(n-1) * rg.Bucket)
	s := Series{Start: start, Now: now, Bucket: rg.Bucket, Pending: make([]int64, n), OldestAge: make([]time.Duration, n),
		Dispatched: make([]float64, n), DeadLettered: make([]int64, n)}
	// Both parts at once, on two connections.
	var (
		parts [2][]chartRow
		errs  [2]error
		wg    sync.WaitGroup
	)
	for i, q := range []string{qChartPending, qChartDispatched} {
		wg.Go(func() { parts[i], errs[i] = chartRows(ctx, db, q, start, rg.Bucket) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return Series{}, err
	}
	diff := make([]int64, n+1)
	oldest := make([]time.Time, n)
	// index turns a bucket start into its index: -1 before the window.
	index := func(t time.Time) int { return max(int(t.Sub(start)/rg.Bucket), -1) }
	for _, r := range slices.Concat(parts[0], parts[1]) {
		end := n // still pending: pending through the last bucket
		if r.Done != nil {
			doneAt := index(*r.Done)
			end = min(doneAt, n)
			if doneAt >= 0 && doneAt < n {
				switch r.Kind {
				case kindDispatched:
					s.Dispatched[doneAt] += float64(r.Count)
				case kindDeadLettered:
					s.DeadLettered[doneAt] += r.Count
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
			if oldest[i].IsZero() || r.MinCreated.Before(oldest[i]) {
				oldest[i] = r.MinCreated
			}
		}
	}
	perMinute := rg.Bucket.Minutes()
	var run int64
	for i := range n {
		run += diff[i]
		s.Pending[i] = run
		s.Dispatched[i] /= perMinute
		if !oldest[i].IsZero() {
			end := start.Add(time.Duration(i+1) * rg.Bucket)
			if end.After(now) {
				end = now
			}
			s.OldestAge[i] = max(end.Sub(oldest[i]), 0)
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
