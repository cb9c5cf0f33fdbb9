package relayfunc

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"reflect"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// InProcess is the relay function's handler run in this process: the same tasks, kick
// coalescing, idle gap and closed sessions as the built function, over a pool and a
// publisher the caller provides (the chaos run injects its faults into both). One
// InProcess is one execution environment: it runs one invocation at a time.
type InProcess struct{ h *handler }

// NewInProcess builds the handler a cold start would, over pool and pub; cfg.Publisher
// must still name a QStash (the dlq-sync task's). Metrics lines go to metricsOut.
func NewInProcess(cfg Env, pool *pgxpool.Pool, pub relay.Publisher, metricsOut io.Writer, logger *slog.Logger) (*InProcess, error) {
	h, err := newHandler(cfg, pool, pub, metricsOut, logger)
	if err != nil {
		return nil, err
	}
	// As at a cold start: an environment holds no session before its first invocation.
	h.closeSessions()
	return &InProcess{h: h}, nil
}

// Invoke runs one invocation under ctx (its deadline is the function's) and returns the
// response as the runtime would encode it: on a function error, its error document and
// the error.
func (p *InProcess) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	res, err := p.h.handle(ctx, payload)
	if err != nil {
		// The runtime's error document: errorType is the error's type name.
		t := reflect.TypeOf(err)
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		doc, _ := json.Marshal(map[string]string{"errorMessage": err.Error(), "errorType": t.Name()})
		return doc, err
	}
	return json.Marshal(res)
}
