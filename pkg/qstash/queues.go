package qstash

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// queue is a QStash queue as GET /v2/queues/{name} describes it.
type queue struct {
	Name        string `json:"name"`
	Parallelism int    `json:"parallelism"`
	Paused      bool   `json:"paused"`
	Lag         int64  `json:"lag"`
}

// QueueMismatchError is a FIFO queue that exists but would not keep per-key order: its
// parallelism is not 1 (two messages of one key could be delivered at once) or it is
// paused (nothing of its keys is delivered).
type QueueMismatchError struct {
	// Queue is the queue's name.
	Queue string
	// Parallelism is the queue's parallelism as QStash reports it.
	Parallelism int
	// Paused reports whether the queue is paused.
	Paused bool
}

// Error says what is wrong with the queue and how to fix it.
func (e *QueueMismatchError) Error() string {
	if e.Paused {
		return fmt.Sprintf("qstash queue %s is paused: its events are accepted but never delivered; resume it (POST /v2/queues/%s/resume) or find out who paused it", e.Queue, e.Queue)
	}
	return fmt.Sprintf("qstash queue %s has parallelism %d, not 1: per-key order is not kept; set it back to 1 (POST /v2/queues/ {\"queueName\":%q,\"parallelism\":1}) once you know why it changed", e.Queue, e.Parallelism, e.Queue)
}

// ensureWorkers bounds the queue requests in flight: QStash's management endpoints have a
// per-second burst limit (docs api-ratelimiting).
const ensureWorkers = 4

// EnsureQueues makes the FIFO queues <QueuePrefix>-0 .. <QueuePrefix>-<FIFOQueues-1> ready,
// once per cold start, before anything is enqueued: a missing queue is created with
// parallelism 1 (POST /v2/queues/) and read back; an existing one is read (GET
// /v2/queues/{name}) and must have parallelism 1 and not be paused. An existing queue that
// does not is reported (*QueueMismatchError naming it), not silently reset: something
// changed it, and order may already be broken. All problems are reported at once. In
// publish ordering it does nothing.
func (p *Publisher) EnsureQueues(ctx context.Context) error {
	if p.cfg.Ordering != publish.OrderingFIFO {
		return nil
	}
	names := make(chan string)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for range min(ensureWorkers, p.cfg.FIFOQueues) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				if err := p.ensureQueue(ctx, name); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range p.cfg.FIFOQueues {
		select {
		case names <- fmt.Sprintf("%s-%d", p.cfg.QueuePrefix, i):
		case <-ctx.Done():
		}
	}
	close(names)
	wg.Wait()
	if ctx.Err() != nil {
		errs = append(errs, fmt.Errorf("ensure qstash queues: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

func (p *Publisher) ensureQueue(ctx context.Context, name string) error {
	q, found, err := p.getQueue(ctx, name)
	if err != nil {
		return err
	}
	if !found {
		body, _ := json.Marshal(map[string]any{"queueName": name, "parallelism": 1})
		if _, err := p.queueRequest(ctx, http.MethodPost, "/v2/queues/", body); err != nil {
			return fmt.Errorf("create qstash queue %s: %w", name, p.queueHint(err))
		}
		if q, found, err = p.getQueue(ctx, name); err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("create qstash queue %s: created, but QStash does not find it", name)
		}
	}
	if q.Parallelism != 1 || q.Paused {
		return &QueueMismatchError{Queue: name, Parallelism: q.Parallelism, Paused: q.Paused}
	}
	return nil
}

// getQueue reads a queue; found is false when QStash answers 404.
func (p *Publisher) getQueue(ctx context.Context, name string) (queue, bool, error) {
	data, err := p.queueRequest(ctx, http.MethodGet, "/v2/queues/"+url.PathEscape(name), nil)
	var ae *APIError
	if errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound {
		return queue{}, false, nil
	}
	if err != nil {
		return queue{}, false, fmt.Errorf("check qstash queue %s: %w", name, p.queueHint(err))
	}
	var q queue
	if err := json.Unmarshal(data, &q); err != nil {
		return queue{}, false, fmt.Errorf("check qstash queue %s: decode %s: %w", name, snippet(data), err)
	}
	return q, true, nil
}

// queueHint names the variable to fix for an error that blames the deployment.
func (p *Publisher) queueHint(err error) error {
	var ae *APIError
	if !errors.As(err, &ae) {
		return err
	}
	switch d := p.classify(ae, 1); d.kind {
	case answerDefer:
		return d.err
	}
	return err
}

// queueRequest sends one queue-management request (api): its answer is small, and it is
// bounded like a batch request.
func (p *Publisher) queueRequest(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	return p.api(ctx, apiRequest{method: method, path: path, body: body, timeout: p.cfg.RequestTimeout, maxAnswer: maxErrorBody * 16})
}
