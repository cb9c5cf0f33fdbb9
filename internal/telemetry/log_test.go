package telemetry_test

import (
	"log/slog"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
	"github.com/outbox-relay/outbox-relay/v3/internal/tracing/tracingtest"
)

// TestLogHandlerAddsTraceIDs: a line logged with a span's context carries that span's
// trace and span ids, through loggers derived with With too; a line logged without a span
// (or without a context) carries neither.
func TestLogHandlerAddsTraceIDs(t *testing.T) {
	t.Parallel()
	_, tr := tracingtest.New(t)
	buf := &logtest.Buffer{}
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(buf, nil))).With(slog.String("component", "test"))

	ctx, span := tr.Start(t.Context(), "work")
	log.InfoContext(ctx, "inside")
	log.Info("inside, no context")
	span.End()
	log.InfoContext(t.Context(), "outside")

	sc := span.SpanContext()
	lines := buf.Lines()
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3: %v", len(lines), lines)
	}
	in := lines[0]
	if in["trace_id"] != sc.TraceID().String() || in["span_id"] != sc.SpanID().String() || in["component"] != "test" {
		t.Fatalf("line inside the span: %v, want trace_id %s span_id %s", in, sc.TraceID(), sc.SpanID())
	}
	for _, l := range lines[1:] {
		if _, ok := l["trace_id"]; ok {
			t.Fatalf("line without a span context has trace_id: %v", l)
		}
		if _, ok := l["span_id"]; ok {
			t.Fatalf("line without a span context has span_id: %v", l)
		}
	}
}

// TestLogHandlerKeepsLevel: the wrapper answers Enabled as the wrapped handler does, so a
// debug line is still dropped at info level.
func TestLogHandlerKeepsLevel(t *testing.T) {
	t.Parallel()
	buf := &logtest.Buffer{}
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	log.DebugContext(t.Context(), "hidden")
	if s := buf.String(); s != "" {
		t.Fatalf("debug line written at info level: %s", s)
	}
}
