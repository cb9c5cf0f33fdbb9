package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
)

// batching returns a provider that exports only in batches an hour apart, so a span
// reaches exp before that only through a flush.
func batching(t *testing.T) (*telemetry.Provider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	p, err := telemetry.NewProvider(context.Background(), sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithBatchTimeout(time.Hour)), "flush-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p, exp
}

// TestFlushHandler: the span a request made is exported when the wrapped handler returns,
// before a Lambda could be frozen; without a provider the handler is left as it is.
func TestFlushHandler(t *testing.T) { // not parallel: NewProvider installs the global provider
	p, exp := batching(t)
	h := telemetry.FlushHandler(p, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, s := p.Tracer().Start(r.Context(), "request")
		s.End()
		w.WriteHeader(http.StatusAccepted)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", nil))
	if got := exp.GetSpans(); w.Code != http.StatusAccepted || len(got) != 1 || got[0].Name != "request" {
		t.Fatalf("status %d, exported %d spans after the request; want 202 and the request's span", w.Code, len(got))
	}

	mux := http.NewServeMux()
	if got := telemetry.FlushHandler(nil, nil, mux); got != http.Handler(mux) {
		t.Fatal("FlushHandler(nil provider) must return the handler itself")
	}
}

// TestFlushAfter: a Lambda handler's spans are exported before it returns, also when it
// fails with its context cancelled.
func TestFlushAfter(t *testing.T) { // not parallel: NewProvider installs the global provider
	p, exp := batching(t)
	fn := telemetry.FlushAfter(p, nil, func(ctx context.Context, task string) (int, error) {
		_, s := p.Tracer().Start(ctx, task)
		s.End()
		return len(task), ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := fn(ctx, "drain")
	if n != 5 || err == nil {
		t.Fatalf("fn = %d, %v; want the handler's own result", n, err)
	}
	if got := exp.GetSpans(); len(got) != 1 || got[0].Name != "drain" {
		t.Fatalf("exported %d spans; want the invocation's span flushed despite the cancelled context", len(got))
	}
	if telemetry.FlushAfter[string, int](nil, nil, nil) != nil {
		t.Fatal("FlushAfter(nil provider) must return fn itself")
	}
}
