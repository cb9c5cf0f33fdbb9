package localstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/origin"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/funcurl"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// Paths of the receivers on the pipeline's loopback server, as the two Function URLs
// would serve them.
const (
	EventsPath  = "/events/"
	FailurePath = "/failure"
)

// ExternalQStash selects a QStash the pipeline does not start (the official dev server).
type ExternalQStash struct {
	URL, Token, CurrentSigningKey, NextSigningKey string
}

// PipelineConfig configures StartPipeline. Zero fields take the defaults noted.
type PipelineConfig struct {
	// Pool is the migrated database the receivers write to. Required.
	Pool *pgxpool.Pool
	// Handlers are the webhook's topic handlers. Required.
	Handlers webhook.Handlers
	// Observe is passed to the webhook (webhook.Config.Observe).
	Observe func(topic, outcome string)
	// QStash configures the built-in QStash server; ignored when External is set. Its Plan
	// defaults to the publisher's, so the server enforces that plan's limits.
	QStash qstashtest.Options
	// External, when set, is used instead of the built-in server.
	External *ExternalQStash
	// QStashFront, when set, wraps the built-in server: the publisher talks to the wrapper
	// (fault injection in front of QStash).
	QStashFront func(http.Handler) http.Handler
	// ReceiverFront, when set, wraps both receivers (fault injection in front of them).
	ReceiverFront func(http.Handler) http.Handler
	// Probes is the probe schedule of the circuits the failure callback opens (zero: the
	// production schedule, deadletter.CircuitProbeWait doubling to CircuitProbeMaxWait).
	Probes deadletter.ProbeSchedule
	// Publisher is the publisher's configuration; BaseURL, Token, DestinationBaseURL and
	// FailureCallbackURL are filled in by StartPipeline.
	Publisher qstash.PublisherConfig
	// Logger receives every component's logs. Default: discard.
	Logger *slog.Logger
	// Tracer, when set, traces the webhook's deliveries and the failure callbacks (and the
	// relays NewRelay makes, unless their config names another). Nil: tracing off.
	Tracer trace.Tracer
}

// Pipeline is everything between the outbox and the consumer's commit, in this process:
// QStash (built-in or external), the webhook and the failure-callback recorder on one
// loopback server, and a publisher aimed at them. Relays are made with NewRelay.
type Pipeline struct {
	// QStash is the built-in server, nil with an external one.
	QStash *qstashtest.Server
	// QStashURL is what the publisher talks to (the front when there is one).
	QStashURL                                string
	Token, CurrentSigningKey, NextSigningKey string
	// BaseURL is the receivers' origin (http://127.0.0.1:port); events go to
	// BaseURL+EventsPath+topic, failure callbacks to FailureURL.
	BaseURL, FailureURL string
	Verifier            *qstash.Verifier
	Webhook             *webhook.Handler
	Callback            *deadletter.CallbackHandler
	Publisher           *qstash.Publisher
	// PublisherConfig is what Publisher was built from (the addresses filled in), for a
	// relay that builds its own (the relay function's handler run in process).
	PublisherConfig qstash.PublisherConfig

	tracer  trace.Tracer
	closers []func()
}

// StartPipeline starts the pipeline. The receivers' listener is opened first, so their URL
// is known before anything that needs it is built; they learn their public origin from the
// request context (internal/origin), as behind a Lambda Function URL, not from configuration.
func StartPipeline(ctx context.Context, cfg PipelineConfig) (*Pipeline, error) {
	if cfg.Pool == nil || cfg.Handlers == nil {
		return nil, errors.New("start pipeline: Pool and Handlers are required")
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))
	p := &Pipeline{tracer: cfg.Tracer}
	if err := p.start(ctx, cfg); err != nil {
		// What started before the error stops.
		p.Close()
		return nil, err
	}
	return p, nil
}

// start brings up the pipeline's parts in order, recording how to close each.
func (p *Pipeline) start(ctx context.Context, cfg PipelineConfig) error {
	if err := p.startQStash(cfg); err != nil {
		return err
	}
	var err error
	if p.Verifier, err = qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: p.CurrentSigningKey, NextSigningKey: p.NextSigningKey}); err != nil {
		return err
	}
	if err := p.serveReceivers(cfg); err != nil {
		return err
	}
	pc := cfg.Publisher
	pc.BaseURL, pc.Token, pc.DestinationBaseURL, pc.FailureCallbackURL = p.QStashURL, p.Token, p.BaseURL, p.FailureURL
	if p.Publisher, err = qstash.NewPublisher(pc); err != nil {
		return err
	}
	p.PublisherConfig = pc
	// As the Lambda does at a cold start: FIFO queues exist with parallelism 1, unpaused.
	if err = p.Publisher.EnsureQueues(ctx); err != nil {
		return fmt.Errorf("start pipeline: check qstash fifo queues: %w", err)
	}
	return nil
}

// startQStash points the pipeline at cfg.External, or starts the local QStash (behind
// cfg.QStashFront when set).
func (p *Pipeline) startQStash(cfg PipelineConfig) error {
	if e := cfg.External; e != nil {
		if e.URL == "" || e.Token == "" || e.CurrentSigningKey == "" || e.NextSigningKey == "" {
			return errors.New("with QSTASH_URL set, QSTASH_TOKEN, QSTASH_CURRENT_SIGNING_KEY and QSTASH_NEXT_SIGNING_KEY are required too")
		}
		p.QStashURL, p.Token, p.CurrentSigningKey, p.NextSigningKey = e.URL, e.Token, e.CurrentSigningKey, e.NextSigningKey
	} else {
		opts := cfg.QStash
		opts.Logger = cmp.Or(opts.Logger, cfg.Logger)
		if opts.Plan == "" {
			// No kinder than production: the server enforces the limits of the plan the
			// publisher is configured for (message size, retries, queues, parallelism).
			opts.Plan = cfg.Publisher.WithDefaults().Plan
		}
		p.QStash = qstashtest.NewServer(opts)
		p.closers = append(p.closers, p.QStash.Close)
		p.QStashURL, p.Token = p.QStash.URL, p.QStash.Token
		p.CurrentSigningKey, p.NextSigningKey = p.QStash.CurrentSigningKey, p.QStash.NextSigningKey
		if cfg.QStashFront != nil {
			url, closeFront, err := serveLoopback(cfg.QStashFront(p.QStash))
			if err != nil {
				return fmt.Errorf("start qstash front: %w", err)
			}
			p.closers = append(p.closers, closeFront)
			p.QStashURL = url
		}
	}
	return nil
}

// serveReceivers serves the webhook and the failure callback on a loopback port.
func (p *Pipeline) serveReceivers(cfg PipelineConfig) error {
	log := cfg.Logger
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen for receivers: %w", err)
	}
	p.BaseURL = "http://" + ln.Addr().String()
	p.FailureURL = p.BaseURL + FailurePath
	// The outbox is in cfg.Pool's database too: a delivery of a generation its event has
	// left (rescheduled by a consumer outage) is acknowledged, not applied (SharesOutbox).
	p.Webhook, err = webhook.New(webhook.Config{Pool: cfg.Pool, Verifier: p.Verifier, Handlers: cfg.Handlers, PublicBaseURL: p.BaseURL, Observe: cfg.Observe, Logger: log, Tracer: cfg.Tracer,
		SharesOutbox: true})
	if err != nil {
		ln.Close()
		return err
	}
	p.Callback, err = deadletter.NewCallbackHandler(deadletter.CallbackConfig{Pool: cfg.Pool, Verifier: p.Verifier, Logger: log, Tracer: cfg.Tracer,
		Probes: cfg.Probes})
	if err != nil {
		ln.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(EventsPath, p.Webhook)
	mux.Handle(FailurePath, p.Callback)
	var h http.Handler = withOrigin(p.BaseURL, mux)
	if cfg.ReceiverFront != nil {
		h = cfg.ReceiverFront(h)
	}
	srv := funcurl.NewLocalServer("", h)
	go func() { _ = srv.Serve(ln) }()
	p.closers = append(p.closers, func() { _ = srv.Close() })
	return nil
}

// NewRelay returns a relay over db publishing through the pipeline's publisher. A cfg
// without Ordering takes the publisher's (relay.New asks it).
func (p *Pipeline) NewRelay(db *pgxpool.Pool, cfg relay.Config) (*relay.Relay, error) {
	if cfg.Tracer == nil {
		cfg.Tracer = p.tracer
	}
	return relay.New(db, p.Publisher, cfg)
}

// Close stops the receivers and the built-in QStash server, newest first.
func (p *Pipeline) Close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
	p.closers = nil
}

// withOrigin gives every request the trusted origin, as funcurl does for a Function URL.
func withOrigin(o string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(origin.NewContext(r.Context(), o)))
	})
}

// serveLoopback serves h on a free loopback port and returns its URL and a closer.
func serveLoopback(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := funcurl.NewLocalServer("", h)
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
