package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
	"github.com/outbox-relay/outbox-relay/v3/pkg/inbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// ConsumerConfig sizes the consumer scenario.
type ConsumerConfig struct {
	// Concurrency levels; Messages per level and way.
	Concurrency []int `json:"concurrency"`
	Messages    int   `json:"messages"`
}

// ConsumerConfigFor returns the consumer scenario's size.
func ConsumerConfigFor(s Size) ConsumerConfig {
	switch s {
	case Full:
		return ConsumerConfig{Concurrency: []int{1, 4, 16}, Messages: 10_000}
	case Short:
		return ConsumerConfig{Concurrency: []int{1, 4, 16}, Messages: 3_000}
	default:
		return ConsumerConfig{Concurrency: []int{1, 4, 16}, Messages: 200}
	}
}

// ConsumerRun is one concurrency level.
type ConsumerRun struct {
	Concurrency int `json:"concurrency"`
	Messages    int `json:"messages"`
	// WebhookPerSec: signed deliveries POSTed over loopback to webhook.Handler.
	WebhookPerSec float64 `json:"webhook_per_sec"`
	// RawPerSec: the same transaction without HTTP: inbox.HandleOnce running
	// orders.OrderCreated (processed_messages insert + one billing_charges insert).
	RawPerSec     float64     `json:"raw_per_sec"`
	WebhookVsRaw  float64     `json:"webhook_vs_raw"`
	WebhookStatus map[int]int `json:"webhook_status"`
	// Rows written by both ways together; each must equal 2*Messages.
	ProcessedRows int64 `json:"processed_rows"`
	ChargeRows    int64 `json:"charge_rows"`
}

// ConsumerResult is the consumer scenario's output.
type ConsumerResult struct {
	Config ConsumerConfig `json:"config"`
	Runs   []ConsumerRun  `json:"runs"`
}

// At returns the run at concurrency c, or nil.
func (r *ConsumerResult) At(c int) *ConsumerRun {
	if r == nil {
		return nil
	}
	return find(r.Runs, func(x *ConsumerRun) bool { return x.Concurrency == c })
}

// Consumer measures webhook.Handler against its own transaction at each concurrency, in the
// same run: first the raw transaction, then the signed HTTP deliveries, on one pool sized
// to the concurrency.
func Consumer(ctx context.Context, url string, cfg ConsumerConfig, progress func(string)) (*ConsumerResult, error) {
	res := &ConsumerResult{Config: cfg}
	for _, c := range cfg.Concurrency {
		run, err := consumerLevel(ctx, url, c, cfg.Messages)
		if err != nil {
			return res, err
		}
		res.Runs = append(res.Runs, run)
		if progress != nil {
			progress(fmt.Sprintf("consumer concurrency=%-2d webhook %6.0f msg/s  raw %6.0f msg/s  ratio %.2f",
				c, run.WebhookPerSec, run.RawPerSec, run.WebhookVsRaw))
		}
	}
	return res, nil
}

func consumerLevel(ctx context.Context, url string, conc, n int) (ConsumerRun, error) {
	run := ConsumerRun{Concurrency: conc, Messages: n, WebhookStatus: map[int]int{}}
	pool, err := openPool(ctx, url, int32(conc))
	if err != nil {
		return run, err
	}
	defer pool.Close()
	if err := Reset(ctx, pool); err != nil {
		return run, err
	}

	// Raw: the webhook's transaction, nothing else.
	rawRun := runID("raw")
	d, err := parallel(ctx, conc, n, func(ctx context.Context, i int) error {
		body := Payload(rawRun, i, KeyName(i%1000))
		sum := sha256.Sum256(body)
		msgID := rawRun + "-" + strconv.Itoa(i)
		_, err := inbox.HandleOnce(ctx, pool, inbox.Message{Consumer: webhook.DefaultConsumer, ID: msgID, PayloadHash: sum[:]}, func(ctx context.Context, tx pgx.Tx) error {
			return orders.OrderCreated(ctx, tx, webhook.Delivery{Topic: Topic, MessageID: msgID, Payload: body})
		})
		return err
	})
	if err != nil {
		return run, fmt.Errorf("raw consumer transaction: %w", err)
	}
	run.RawPerSec = rate(n, d)

	// Webhook: signed deliveries over loopback, signed before the clock starts (signing is
	// QStash's work, not the consumer's).
	srv, reqs, err := startWebhook(pool, n)
	if err != nil {
		return run, err
	}
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc * 2}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	d, err = parallel(ctx, conc, n, func(ctx context.Context, i int) error {
		r := reqs[i]
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(r.body))
		if err != nil {
			return err
		}
		req.Header = r.header.Clone()
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		mu.Lock()
		run.WebhookStatus[resp.StatusCode]++
		mu.Unlock()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("webhook answered %d to delivery %d", resp.StatusCode, i)
		}
		return nil
	})
	if err != nil {
		return run, fmt.Errorf("webhook deliveries: %w", err)
	}
	run.WebhookPerSec = rate(n, d)
	run.WebhookVsRaw = ratio(run.WebhookPerSec, run.RawPerSec)
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM processed_messages), (SELECT count(*) FROM billing_charges)`).
		Scan(&run.ProcessedRows, &run.ChargeRows); err != nil {
		return run, fmt.Errorf("count consumer rows: %w", err)
	}
	if run.ProcessedRows != int64(2*n) || run.ChargeRows != int64(2*n) {
		return run, fmt.Errorf("consumer wrote %d processed_messages and %d billing_charges rows, want %d each", run.ProcessedRows, run.ChargeRows, 2*n)
	}
	return run, nil
}

type signedRequest struct {
	url    string
	body   []byte
	header http.Header
}

// startWebhook serves webhook.Handler (order.created) on loopback and signs n deliveries
// for it with the dev signing key, exactly as QStash would.
func startWebhook(pool *pgxpool.Pool, n int) (*httptest.Server, []signedRequest, error) {
	// The listener exists before the server starts, so the webhook knows its URL.
	srv := httptest.NewUnstartedServer(nil)
	base := "http://" + srv.Listener.Addr().String()
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	wh, err := webhook.New(webhook.Config{
		Pool: pool, Verifier: v, PublicBaseURL: base, Logger: discardLogger(),
		Handlers: webhook.Handlers{Topic: orders.OrderCreated},
	})
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	srv.Config.Handler = wh
	srv.Start()
	run := runID("wh")
	url := srv.URL + "/events/" + Topic
	now := time.Now()
	// The message id is in the signed URL, as the relay publishes it; a time-derived base
	// keeps runs against one database from colliding.
	first := now.UnixMicro() * 1000
	reqs := make([]signedRequest, n)
	for i := range reqs {
		body := Payload(run, i, KeyName(i%1000))
		id := strconv.FormatInt(first+int64(i), 10)
		target := url + "?outbox_id=" + id + "&generation=0"
		sig, err := qstash.Sign(qstash.DevCurrentSigningKey, target, body, now)
		if err != nil {
			srv.Close()
			return nil, nil, err
		}
		hd := http.Header{}
		hd.Set("Content-Type", "application/json")
		hd.Set("Upstash-Signature", sig)
		hd.Set("Upstash-Message-Id", "msg_"+run+strconv.Itoa(i))
		hd.Set("Upstash-Retried", "0")
		hd.Set("X-Outbox-Id", id)
		reqs[i] = signedRequest{url: target, body: body, header: hd}
	}
	return srv, reqs, nil
}

// parallel runs fn for 0..n-1 on conc workers and returns the wall time, or the first error.
func parallel(ctx context.Context, conc, n int, fn func(ctx context.Context, i int) error) (time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if first == nil && ctx.Err() != nil && !errors.Is(ctx.Err(), context.Canceled) {
		first = ctx.Err()
	}
	return d, first
}
