package relayenv

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/retention"
)

func minimal() map[string]string {
	return map[string]string{
		"DATABASE_URL":    "postgres://relay@db.internal:5432/app?sslmode=require",
		"QSTASH_TOKEN":    "tok",
		"PUBLIC_BASE_URL": "https://abc.lambda-url.eu-west-1.on.aws/",
	}
}

// readWith reads the minimal environment with set added (set may override it).
func readWith(set map[string]string) (Config, error) {
	m := minimal()
	maps.Copy(m, set)
	return Read(env(m))
}

func TestReadDefaults(t *testing.T) {
	t.Parallel()
	c, err := Read(env(minimal()))
	if err != nil {
		t.Fatal(err)
	}
	if c.Relay.BatchSize != relay.DefaultBatchSize || c.Relay.Lease != relay.DefaultLease || c.Relay.MaxAttempts != relay.DefaultMaxAttempts ||
		c.Relay.PublishConcurrency != relay.DefaultPublishConcurrency || c.Relay.Ordering != publish.OrderingPublish {
		t.Fatalf("relay defaults: %+v", c.Relay)
	}
	p := c.Publisher
	if p.BaseURL != qstash.DefaultBaseURL || p.Retries != qstash.DefaultRetries || p.Ordering != publish.OrderingPublish ||
		p.RequestTimeout != relay.DefaultPublishTimeout || p.DestinationBaseURL != "https://abc.lambda-url.eu-west-1.on.aws/" {
		t.Fatalf("publisher defaults: %+v", p)
	}
	if c.Retention.OutboxRetention != retention.DefaultOutboxRetention || c.Retention.DedupeTTL != retention.DefaultDedupeTTL {
		t.Fatalf("retention defaults: %+v", c.Retention)
	}
	if c.IdleGap != time.Second || c.MetricsNamespace != "OutboxRelay" || c.LogLevel.String() != "INFO" {
		t.Fatalf("defaults: idle gap %v ns %q level %v", c.IdleGap, c.MetricsNamespace, c.LogLevel)
	}
	if _, err := qstash.NewPublisher(c.Publisher); err != nil {
		t.Fatalf("publisher config does not build: %v", err)
	}
}

func TestReadEverySetting(t *testing.T) {
	t.Parallel()
	m := minimal()
	maps.Copy(m, map[string]string{
		"QSTASH_URL": "http://127.0.0.1:8080", "FAILURE_CALLBACK_URL": "https://fail.example.com/",
		"QSTASH_RETRIES": "0", "ORDERING": "FIFO", "FIFO_QUEUES": "4", "BATCH_SIZE": "250", "LEASE": "45s",
		"PUBLISH_CONCURRENCY": "8", "PUBLISH_TIMEOUT": "5s", "MAX_ATTEMPTS": "6", "BACKOFF_BASE": "10s", "BACKOFF_MAX": "10m",
		"IDLE_GAP": "2500ms", "OUTBOX_RETENTION": "3d", "DEDUPE_TTL": "30d", "METRICS_NAMESPACE": "Shop", "LOG_LEVEL": "DEBUG",
		"OUTBOX_NAME": "shop-prod", "QSTASH_PLAN": "Free", "QSTASH_MAX_MESSAGE_BYTES": "500000", "QSTASH_MAX_REQUEST_BYTES": "1048576",
		"QSTASH_RETRY_DELAY": "20s",
	})
	c, err := Read(env(m))
	if err != nil {
		t.Fatal(err)
	}
	if c.Publisher.Retries != qstash.NoRetries || c.Publisher.Ordering != publish.OrderingFIFO || c.Publisher.FIFOQueues != 4 ||
		c.Publisher.BaseURL != "http://127.0.0.1:8080" || c.Publisher.FailureCallbackURL != "https://fail.example.com/" ||
		c.Publisher.RequestTimeout != 5*time.Second || c.Publisher.Name != "shop-prod" || c.Publisher.QueuePrefix != "shop-prod" ||
		c.Publisher.Plan != qstash.PlanFree || c.Publisher.MaxMessageBytes != 500_000 || c.Publisher.MaxRequestBytes != 1<<20 ||
		c.Publisher.RetryDelay != 20*time.Second {
		t.Fatalf("publisher: %+v", c.Publisher)
	}
	if c.Relay.BatchSize != 250 || c.Relay.Lease != 45*time.Second || c.Relay.PublishTimeout != 5*time.Second ||
		c.Relay.MaxAttempts != 6 || c.Relay.BackoffBase != 10*time.Second || c.Relay.BackoffMax != 10*time.Minute ||
		c.Relay.PublishConcurrency != 8 || c.Relay.Ordering != publish.OrderingFIFO {
		t.Fatalf("relay: %+v", c.Relay)
	}
	if c.IdleGap != 2500*time.Millisecond || c.Retention.OutboxRetention != 72*time.Hour || c.Retention.DedupeTTL != 30*24*time.Hour ||
		c.MetricsNamespace != "Shop" || c.LogLevel.String() != "DEBUG" {
		t.Fatalf("rest: %+v", c)
	}
	m["ORDERING"], m["FLOW_CONTROL_PARALLELISM"], m["FLOW_CONTROL_RATE"], m["FLOW_CONTROL_PERIOD"] = "publish", "2", "50", "60s"
	c, err = Read(env(m))
	if err != nil || c.Relay.Ordering != publish.OrderingPublish || c.Publisher.FlowControlParallelism != 2 || c.Publisher.FlowControlRate != 50 || c.Publisher.FlowControlPeriod != time.Minute {
		t.Fatalf("flow control: %+v %v", c.Publisher, err)
	}
}

// TestReadReportsEverythingAtOnce sets every variable wrong and expects every one named.
func TestReadReportsEverythingAtOnce(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"DATABASE_URL": "postgres://u:secret@host:notaport/db", "QSTASH_URL": "ftp://x", "PUBLIC_BASE_URL": "not a url",
		"FAILURE_CALLBACK_URL": "mailto:x", "QSTASH_RETRIES": "-2", "ORDERING": "lifo", "FIFO_QUEUES": "0",
		"FLOW_CONTROL_PARALLELISM": "x", "FLOW_CONTROL_RATE": "-1", "FLOW_CONTROL_PERIOD": "soon",
		"BATCH_SIZE": "0", "PUBLISH_CONCURRENCY": "0", "LEASE": "ten", "PUBLISH_TIMEOUT": "-1s", "MAX_ATTEMPTS": "many", "BACKOFF_BASE": "1x",
		"BACKOFF_MAX": "y", "IDLE_GAP": "z", "OUTBOX_RETENTION": "forever", "DEDUPE_TTL": "1h", "LOG_LEVEL": "loud",
		"OUTBOX_NAME": "a:b", "QSTASH_PLAN": "gold", "QSTASH_MAX_MESSAGE_BYTES": "0", "QSTASH_MAX_REQUEST_BYTES": "1",
		"QSTASH_RETRY_DELAY": "soon",
	}
	_, err := Read(env(bad))
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	named := vars(err)
	for name := range bad {
		if !named[name] {
			t.Errorf("no *VarError for %s in %v", name, err)
		}
	}
	if !named["QSTASH_TOKEN"] || !strings.Contains(msg, "QSTASH_TOKEN: is not set") {
		t.Error("missing QSTASH_TOKEN not reported")
	}
	if strings.Contains(msg, "secret") {
		t.Errorf("error leaks the database password: %s", msg)
	}
}

func TestReadConsistency(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		set  map[string]string
		want []string
	}{
		"missing required": {map[string]string{"DATABASE_URL": "", "QSTASH_TOKEN": "", "PUBLIC_BASE_URL": ""},
			[]string{"DATABASE_URL: is not set", "QSTASH_TOKEN: is not set", "PUBLIC_BASE_URL: is not set"}},
		"lease under publish timeout":  {map[string]string{"LEASE": "5s", "PUBLISH_TIMEOUT": "10s"}, []string{"LEASE: relay config Lease"}},
		"dedupe ttl inside horizon":    {map[string]string{"DEDUPE_TTL": "2h"}, []string{"DEDUPE_TTL: ", "2h0m0s", "retry horizon"}},
		"flow control in fifo":         {map[string]string{"ORDERING": "fifo", "FLOW_CONTROL_RATE": "5"}, []string{"flow control is for publish ordering"}},
		"backoff max under base":       {map[string]string{"BACKOFF_BASE": "1m", "BACKOFF_MAX": "30s"}, []string{"BACKOFF_MAX: "}},
		"dedupe ttl vs qstash retries": {map[string]string{"QSTASH_RETRIES": "30", "QSTASH_PLAN": "fixed"}, []string{"QStash 30 retries"}},
		"fifo queues over the plan":    {map[string]string{"ORDERING": "fifo", "FIFO_QUEUES": "11", "QSTASH_PLAN": "free"}, []string{"FIFO_QUEUES: ", "10 queues"}},
		"fifo queues over the default": {map[string]string{"ORDERING": "fifo", "FIFO_QUEUES": "101"}, []string{"FIFO_QUEUES: ", "payg plan"}},
		"retries over the plan":        {map[string]string{"QSTASH_RETRIES": "4", "QSTASH_PLAN": "free"}, []string{"QSTASH_RETRIES: 4", "QSTASH_PLAN"}},
		"message size over the plan":   {map[string]string{"QSTASH_MAX_MESSAGE_BYTES": "2000000", "QSTASH_PLAN": "free"}, []string{"QSTASH_MAX_MESSAGE_BYTES: "}},
		"qstash url with /v2":          {map[string]string{"QSTASH_URL": "https://qstash.upstash.io/v2"}, []string{"QSTASH_URL: ", "no path"}},
		"qstash url plain http":        {map[string]string{"QSTASH_URL": "http://qstash.upstash.io"}, []string{"QSTASH_URL: ", "https"}},
		"outbox retention in horizon":  {map[string]string{"OUTBOX_RETENTION": "2h"}, []string{"OUTBOX_RETENTION: ", "2h0m0s", "retry horizon"}},
		"batch bytes zero":             {map[string]string{"BATCH_BYTES": "0"}, []string{"BATCH_BYTES: ", "whole number"}},
		"in flight bytes with a unit":  {map[string]string{"IN_FLIGHT_BYTES": "32MiB"}, []string{"IN_FLIGHT_BYTES: ", "whole number"}},
		"in flight under one batch":    {map[string]string{"BATCH_BYTES": "9000000", "IN_FLIGHT_BYTES": "8000000"}, []string{"IN_FLIGHT_BYTES: ", "below MaxBatchBytes"}},
		"lambda memory size":           {map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256MB"}, []string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE: ", "whole MB"}},
		// The failure function refuses a query in its URL (envconfig.ReadFailure): the relay
		// must not publish callbacks to one.
		"failure callback url with a query": {map[string]string{"FAILURE_CALLBACK_URL": "https://abc.lambda-url.eu-west-1.on.aws/?k=v"}, []string{"FAILURE_CALLBACK_URL: ", "absolute URL"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := readWith(c.set)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
		})
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func vars(err error) map[string]bool {
	out := map[string]bool{}
	for _, v := range envconfig.Vars(err) {
		out[v] = true
	}
	return out
}

// TestReadEmptyNamesEachVariableOnce: with no environment, each required variable is
// reported once, as not set (not again as the library's empty field).
func TestReadEmptyNamesEachVariableOnce(t *testing.T) {
	t.Parallel()
	_, err := Read(env(nil))
	got := envconfig.Vars(err)
	if want := []string{"DATABASE_URL", "QSTASH_TOKEN", "PUBLIC_BASE_URL"}; !slices.Equal(got, want) {
		t.Fatalf("variables named %v, want %v:\n%v", got, want, err)
	}
}
