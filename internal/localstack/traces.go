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
	ix := indexSpans(spans)
	shown := 0
	for _, r := range ix.roots {
		if shown == n {
			break
		}
		id := r.SpanContext().SpanID()
		if len(ix.children[id]) == 0 && len(ix.linkers[id]) == 0 {
			continue // a span nothing followed: not an event's trace
		}
		shown++
		fmt.Fprintf(w, "trace %s\n", r.SpanContext().TraceID())
		var walk func(s sdktrace.ReadOnlySpan, depth int, how string)
		walk = func(s sdktrace.ReadOnlySpan, depth int, how string) {
			fmt.Fprintf(w, "%s%s%s  [%s, %s]%s\n", strings.Repeat("  ", depth), how, s.Name(),
				s.SpanKind().String(), s.EndTime().Sub(s.StartTime()).Round(10*time.Microsecond), attrs(s))
			id := s.SpanContext().SpanID()
			for _, k := range ix.linkersOf(id) {
				fmt.Fprintf(w, "%s  ~ linked from %s  [%s, trace %s]\n", strings.Repeat("  ", depth), k.Name(),
					k.SpanKind().String(), k.SpanContext().TraceID())
			}
			for _, k := range ix.childrenOf(id) {
				walk(k, depth+1, "└ ")
			}
		}
		walk(r, 0, "")
	}
	if shown == 0 {
		fmt.Fprintln(w, "no traces recorded")
	}
}

// spanIndex is recorded spans as trees: children by parent, the spans linking to each span,
// and the roots (spans without a parent, except the relay's batch spans, which hang off
// the producer spans they link), oldest first.
type spanIndex struct {
	children, linkers map[trace.SpanID][]sdktrace.ReadOnlySpan
	roots             []sdktrace.ReadOnlySpan
}

func indexSpans(spans []sdktrace.ReadOnlySpan) spanIndex {
	ix := spanIndex{children: map[trace.SpanID][]sdktrace.ReadOnlySpan{}, linkers: map[trace.SpanID][]sdktrace.ReadOnlySpan{}}
	for _, s := range spans {
		if p := s.Parent(); p.IsValid() {
			ix.children[p.SpanID()] = append(ix.children[p.SpanID()], s)
		} else if s.SpanKind() != trace.SpanKindProducer || len(s.Links()) == 0 {
			ix.roots = append(ix.roots, s) // a producer's own span; batch spans hang off their links
		}
		for _, l := range s.Links() {
			ix.linkers[l.SpanContext.SpanID()] = append(ix.linkers[l.SpanContext.SpanID()], s)
		}
	}
	slices.SortFunc(ix.roots, byStart)
	return ix
}

func (ix spanIndex) childrenOf(id trace.SpanID) []sdktrace.ReadOnlySpan {
	return sortedByStart(ix.children[id])
}

func (ix spanIndex) linkersOf(id trace.SpanID) []sdktrace.ReadOnlySpan {
	return sortedByStart(ix.linkers[id])
}

func byStart(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) }

func sortedByStart(spans []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	c := slices.Clone(spans)
	slices.SortFunc(c, byStart)
	return c
}

// attrs renders the attributes an operator reads in a trace tree.
func attrs(s sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, kv := range s.Attributes() {
		switch kv.Key {
		case "messaging.destination.name", "messaging.batch.message_count", "messaging.message.id",
			"messaging.qstash.retried", "outbox.inbox_outcome", "http.response.status_code":
			fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.String())
		}
	}
	return b.String()
}
