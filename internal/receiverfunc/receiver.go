package receiverfunc

import (
	"io"
	"log/slog"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// Receiver is one receiver function as its main package describes it: its variables, its
// metrics and its handler. The rest of its cold start (and the metrics writer) is shared.
type Receiver struct {
	// Function is the metrics' Function dimension (metrics.FunctionWebhook, ...); the
	// traces' service is "outbox-" + Function.
	Function string
	// Read reads the function's variables.
	Read Read
	// Outcomes maps each counted outcome to the metrics it adds 1 to (Observer).
	Outcomes map[string][]string
	// Topics may become the metrics' Topic dimension (metrics.EMFConfig.Topics); nil: none.
	Topics []string
	// Handler makes the function's handler on what its cold start opened.
	Handler func(Parts) (http.Handler, error)
}

// Parts are what a receiver's handler is built on: the cold start's pool and signature
// verifier, the configured public URL and body limit, its logger and tracer, and an
// Observe that counts outcomes as the Receiver's Outcomes say.
type Parts struct {
	Pool      *pgxpool.Pool
	Verifier  *qstash.Verifier
	PublicURL string
	// FunctionURL is true when the handler is served as a Lambda Function URL (no
	// LISTEN_ADDR), whose event names the signed URL's origin.
	FunctionURL  bool
	MaxBodyBytes int64
	Logger       *slog.Logger
	// Tracer is nil when tracing is off.
	Tracer  trace.Tracer
	Observe func(topic, outcome string)
}

// Main runs r as Main runs a receiver.
func (r Receiver) Main() { Main("outbox-"+r.Function, r.Read, r.Build) }

// Build is r as Main and Start take it: r.Handler on the cold start's parts, with its
// metrics written as EMF lines to stdout (CloudWatch Logs extracts them).
func (r Receiver) Build(cfg Config, pool *pgxpool.Pool, v *qstash.Verifier, logger *slog.Logger) (http.Handler, error) {
	return r.Handler(Parts{
		Pool:         pool,
		Verifier:     v,
		PublicURL:    cfg.PublicURL,
		FunctionURL:  cfg.ListenAddr == "",
		MaxBodyBytes: cfg.MaxBodyBytes,
		Logger:       logger,
		Tracer:       cfg.Tracer,
		Observe:      r.Observer(os.Stdout, cfg.MetricsNamespace, logger),
	})
}

// Observer is Observer for r's function, outcomes and topics, writing EMF lines in
// namespace (empty: metrics.DefaultNamespace) to w.
func (r Receiver) Observer(w io.Writer, namespace string, logger *slog.Logger) func(topic, outcome string) {
	return Observer(metrics.NewEMF(w, metrics.EMFConfig{Namespace: namespace, Topics: r.Topics}), logger, r.Function, r.Outcomes)
}
