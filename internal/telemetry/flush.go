package telemetry

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// DefaultFlushTimeout bounds the flush after an invocation when its context has no
// deadline of its own: a collector that does not answer must not hold the function.
const DefaultFlushTimeout = 2 * time.Second

// FlushHandler returns h, flushing finished spans after each request when p is not nil
// (a Function URL's response is buffered: it leaves when the Lambda handler returns, which
// is after the flush, and the environment may be frozen right after). With p nil it
// returns h itself. A flush error is logged, never answered: the request was served.
func FlushHandler(p *Provider, log *slog.Logger, h http.Handler) http.Handler {
	if p == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer p.flushAfter(r.Context(), log)
		h.ServeHTTP(w, r)
	})
}

// FlushAfter returns fn, flushing finished spans before each invocation returns when p is
// not nil; it is how a Lambda handler such as the relay's is wrapped before lambda.Start.
// With p nil it returns fn itself.
func FlushAfter[E, R any](p *Provider, log *slog.Logger, fn func(context.Context, E) (R, error)) func(context.Context, E) (R, error) {
	if p == nil {
		return fn
	}
	return func(ctx context.Context, ev E) (R, error) {
		defer p.flushAfter(ctx, log)
		return fn(ctx, ev)
	}
}

// flushAfter flushes under ctx's deadline (the invocation's), or DefaultFlushTimeout, even
// when ctx was cancelled: the spans of a failed invocation matter most.
func (p *Provider) flushAfter(ctx context.Context, log *slog.Logger) {
	deadline := time.Now().Add(DefaultFlushTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	if err := p.Flush(fctx); err != nil && log != nil {
		log.WarnContext(ctx, "flush spans", slog.Any("error", err))
	}
}
