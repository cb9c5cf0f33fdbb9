package localstack

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// RenderTraces writes the span trees of at most n traces that start at a producer's span,
// oldest first: each span's children, and under every span the spans that link to it (the
// relay's batch span links every event it published; a redelivery's span links the
// producer's). It is what `outboxctl dev --trace` prints.
func RenderTraces(w io.Writer, spans []sdktrace.ReadOnlySpan, n int) {
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	linkers := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if p := s.Parent(); p.IsValid() {
			children[p.SpanID()] = append(children[p.SpanID()], s)
		} else if s.SpanKind() != trace.SpanKindProducer || len(s.Links()) == 0 {
			roots = append(roots, s) // a producer's own span; batch spans hang off their links
		}
		for _, l := range s.Links() {
			linkers[l.SpanContext.SpanID()] = append(linkers[l.SpanContext.SpanID()], s)
		}
	}
	byStart := func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) }
	slices.SortFunc(roots, byStart)
	shown := 0
	for _, r := range roots {
		if shown == n {
			break
		}
		if len(children[r.SpanContext().SpanID()]) == 0 && len(linkers[r.SpanContext().SpanID()]) == 0 {
			continue // a span nothing followed: not an event's trace
		}
		shown++
		fmt.Fprintf(w, "trace %s\n", r.SpanContext().TraceID())
		var walk func(s sdktrace.ReadOnlySpan, depth int, how string)
		walk = func(s sdktrace.ReadOnlySpan, depth int, how string) {
			fmt.Fprintf(w, "%s%s%s  [%s, %s]%s\n", strings.Repeat("  ", depth), how, s.Name(),
				s.SpanKind().String(), s.EndTime().Sub(s.StartTime()).Round(10*time.Microsecond), attrs(s))
			id := s.SpanContext().SpanID()
			l := slices.Clone(linkers[id])
			slices.SortFunc(l, byStart)
			for _, k := range l {
				fmt.Fprintf(w, "%s  ~ linked from %s  [%s, trace %s]\n", strings.Repeat("  ", depth), k.Name(),
					k.SpanKind().String(), k.SpanContext().TraceID())
			}
			c := slices.Clone(children[id])
			slices.SortFunc(c, byStart)
			for _, k := range c {
				walk(k, depth+1, "└ ")
			}
		}
		walk(r, 0, "")
	}
	if shown == 0 {
		fmt.Fprintln(w, "no traces recorded")
	}
}

// attrs renders the attributes an operator reads in a trace tree.
func attrs(s sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, kv := range s.Attributes() {
		switch kv.Key {
		case "messaging.destination.name", "messaging.batch.message_count", "messaging.message.id",
			"messaging.qstash.retried", "outbox.inbox_outcome", "http.response.status_code":
			fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.Emit())
		}
	}
	return b.String()
}
