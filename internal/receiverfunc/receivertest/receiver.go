package receivertest

import (
	"net/http"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outbox-relay/outbox-relay/internal/receiverfunc"
	"github.com/outbox-relay/outbox-relay/pkg/postgres/pgtest"
)

// StartReceiver checks how r reads its environment (RequireConfig with v), then runs its
// cold start as Start does, with v.Good as its public URL.
func StartReceiver(t *testing.T, r receiverfunc.Receiver, v Vars, path string) (http.Handler, *pgtest.DB, *tracetest.SpanRecorder) {
	t.Helper()
	RequireConfig(t, r.Read, v)
	return Start(t, r.Read, r.Build, map[string]string{v.PublicURL: v.Good}, path)
}

// ServeTraced is ServeSigned, then checks that the tracer the cold start was given (rec's)
// reaches the handler: the request ended the spans named spans, in that order.
func ServeTraced(t *testing.T, h http.Handler, rec *tracetest.SpanRecorder, signedURL, target string, body []byte, spans ...string) {
	t.Helper()
	ServeSigned(t, h, signedURL, target, body)
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	if !slices.Equal(names, spans) {
		t.Fatalf("spans %q, want %q", names, spans)
	}
}
