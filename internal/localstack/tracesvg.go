package localstack

import (
	"bufio"
	"errors"
	"fmt"
	"html"
	"io"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ErrNoTrace is returned by WriteTraceSVG when no recorded trace starts at a producer span
// that something followed.
var ErrNoTrace = errors.New("no event trace recorded")

// traceRow is one bar of the SVG: a span, its depth in the tree and whether it is in the
// tree by a link (the relay's batch span) rather than as a child.
type traceRow struct {
	span   sdktrace.ReadOnlySpan
	depth  int
	linked bool
}

// WriteTraceSVG draws the first event trace in spans (the one RenderTraces prints first)
// as a Gantt chart: the producer's span, the relay batch span that links it (with its
// children), the delivery and the spans under it, each a bar on one time axis. It is the
// picture in docs/observability.md (docs/trace.svg). It returns ErrNoTrace when there is none.
func WriteTraceSVG(w io.Writer, spans []sdktrace.ReadOnlySpan) error {
	rows := firstTrace(spans)
	if rows == nil {
		return ErrNoTrace
	}
	t0, t1 := rows[0].span.StartTime(), rows[0].span.EndTime()
	for _, r := range rows {
		t0 = minTime(t0, r.span.StartTime())
		if r.span.EndTime().After(t1) {
			t1 = r.span.EndTime()
		}
	}
	total := max(t1.Sub(t0), time.Microsecond)

	const (
		width, labelW, barW = 980, 330, 560
		rowH, top           = 28, 58
	)
	height := top + len(rows)*rowH + 40
	x := func(t time.Time) float64 { return labelW + float64(t.Sub(t0))/float64(total)*barW }

	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="ui-monospace, Menlo, Consolas, monospace" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(b, `<text x="12" y="22" font-size="14" font-weight="bold">One event, producer to consumer commit (trace %s)</text>`+"\n",
		rows[0].span.SpanContext().TraceID())
	fmt.Fprintf(b, `<text x="12" y="40" fill="#555">dashed: in another trace, linked to the producer span; bars share one time axis (%s in all)</text>`+"\n",
		fmtDuration(total))
	for i := 0; i <= 4; i++ {
		tx := labelW + float64(i)*barW/4
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e0e0e0"/>`+"\n", tx, top-6, tx, top+len(rows)*rowH)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" fill="#777" text-anchor="middle">%s</text>`+"\n", tx, top+len(rows)*rowH+16, fmtDuration(total*time.Duration(i)/4))
	}
	for i, r := range rows {
		y := top + i*rowH
		s := r.span
		label := strings.Repeat("  ", r.depth) + s.Name()
		if r.linked && r.depth == 1 {
			label = "  ~ " + s.Name() // the span linking the producer's; its children are in its trace
		}
		fmt.Fprintf(b, `<text x="12" y="%d" xml:space="preserve">%s</text>`+"\n", y+17, html.EscapeString(label))
		x0, x1 := x(s.StartTime()), x(s.EndTime())
		dash := ""
		if r.linked {
			dash = ` stroke="#333" stroke-dasharray="4 3"`
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="3" fill="%s"%s><title>%s</title></rect>`+"\n",
			x0, y+4, max(x1-x0, 1.5), rowH-10, barColor(s), dash, html.EscapeString(spanTitle(s)))
		fmt.Fprintf(b, `<text x="%.1f" y="%d" fill="#333">%s</text>`+"\n", min(x1+6, width-70), y+17, fmtDuration(s.EndTime().Sub(s.StartTime())))
	}
	fmt.Fprintln(b, `</svg>`)
	return b.Flush()
}

// firstTrace returns the rows of the first trace RenderTraces would print: the producer's
// root span, the spans linking to it with their subtrees, then its children's subtrees.
func firstTrace(spans []sdktrace.ReadOnlySpan) []traceRow {
	ix := indexSpans(spans)
	for _, root := range ix.roots {
		id := root.SpanContext().SpanID()
		if len(ix.children[id]) == 0 || len(ix.linkers[id]) == 0 {
			continue // the picture wants a trace the relay published and a consumer processed
		}
		rows := []traceRow{{span: root}}
		var walk func(s sdktrace.ReadOnlySpan, depth int, linked bool)
		walk = func(s sdktrace.ReadOnlySpan, depth int, linked bool) {
			rows = append(rows, traceRow{span: s, depth: depth, linked: linked})
			for _, k := range ix.childrenOf(s.SpanContext().SpanID()) {
				walk(k, depth+1, linked)
			}
		}
		for _, k := range ix.linkersOf(id) {
			walk(k, 1, true)
		}
		for _, k := range ix.childrenOf(id) {
			walk(k, 1, false)
		}
		return rows
	}
	return nil
}

func barColor(s sdktrace.ReadOnlySpan) string {
	switch {
	case s.SpanKind() == trace.SpanKindProducer:
		return "#f28e2b" // the relay's batch
	case s.SpanKind() == trace.SpanKindConsumer:
		return "#59a14f" // the delivery
	case !s.Parent().IsValid():
		return "#4e79a7" // the producer's business transaction
	default:
		return "#76b7b2"
	}
}

// spanTitle is the tooltip: the name and the attributes an operator reads in the tree.
func spanTitle(s sdktrace.ReadOnlySpan) string {
	return s.Name() + " [" + strings.ToLower(s.SpanKind().String()) + "]" + attrs(s)
}

func fmtDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%dµs", d.Microseconds())
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
