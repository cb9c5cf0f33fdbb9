package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys of the span a record was logged in: hex, as trace backends (X-Ray
// through the ADOT collector, Jaeger, Tempo) show them, so a log search by trace id finds
// the lines of one trace.
const (
	TraceIDKey = "trace_id"
	SpanIDKey  = "span_id"
)

// LogHandler returns h adding TraceIDKey and SpanIDKey to every record logged with a
// context that holds a valid span context (the *Context forms of slog.Logger, or Log).
// Records without one pass through unchanged, so with tracing off it adds nothing. The
// attributes join the logger's open group, if any; the functions and the CLI log without
// groups, so they are top-level keys.
func LogHandler(h slog.Handler) slog.Handler {
	return traceHandler{h}
}

type traceHandler struct{ next slog.Handler }

func (h traceHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		// r is this handler's copy: the logger hands each record to one handler, so adding
		// to it cannot show up in another's.
		r.AddAttrs(slog.String(TraceIDKey, sc.TraceID().String()), slog.String(SpanIDKey, sc.SpanID().String()))
	}
	return h.next.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.next.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.next.WithGroup(name)}
}
