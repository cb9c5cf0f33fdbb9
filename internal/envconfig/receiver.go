package envconfig

import (
	"log/slog"
	"strconv"

	"github.com/outbox-relay/outbox-relay/pkg/qstash"
)

// The receivers' variables, their defaults and meaning are described in package envdoc
// (`outboxctl env`, docs/configuration.md).

// ReceiverConfig is what a QStash receiver needs.
type ReceiverConfig struct {
	DatabaseURL       string
	CurrentSigningKey string
	NextSigningKey    string
	MaxBodyBytes      int64
	LogLevel          slog.Level
	// MetricsNamespace is METRICS_NAMESPACE (empty: metrics.DefaultNamespace).
	MetricsNamespace string
	// ListenAddr is LISTEN_ADDR: serve over net/http instead of as a Lambda.
	ListenAddr string
	// PublicURL is the webhook's PUBLIC_BASE_URL or the failure callback's
	// FAILURE_CALLBACK_URL: the signed URL's base (or whole URL), when not the Function URL's.
	PublicURL string
}

// ReadWebhook reads the webhook's configuration; maxBody is its default body limit.
func ReadWebhook(getenv func(string) string, maxBody int64) (ReceiverConfig, error) {
	r := NewReader(getenv)
	c := readReceiver(r, maxBody)
	c.PublicURL = r.AbsoluteURL("PUBLIC_BASE_URL", "https://hooks.example.com", "PublicBaseURL")
	return c, r.Err()
}

// ReadFailure reads the failure-callback recorder's configuration; maxBody is its default
// body limit. FAILURE_CALLBACK_URL is the same variable the relay publishes.
func ReadFailure(getenv func(string) string, maxBody int64) (ReceiverConfig, error) {
	r := NewReader(getenv)
	c := readReceiver(r, maxBody)
	c.PublicURL = r.AbsoluteURL("FAILURE_CALLBACK_URL", "https://abc.lambda-url.eu-west-1.on.aws/", "FailureURL")
	return c, r.Err()
}

func readReceiver(r *Reader, maxBody int64) ReceiverConfig {
	c := ReceiverConfig{
		DatabaseURL:       r.DatabaseURL(),
		CurrentSigningKey: r.Required("QSTASH_CURRENT_SIGNING_KEY", "QStash console, Signing keys", "CurrentSigningKey"),
		NextSigningKey:    r.Required("QSTASH_NEXT_SIGNING_KEY", "QStash console, Signing keys; an empty key would accept forged tokens", "NextSigningKey"),
		MaxBodyBytes:      maxBody,
		MetricsNamespace:  r.Get("METRICS_NAMESPACE"),
		ListenAddr:        r.Get("LISTEN_ADDR"),
	}
	if v := r.Str("MAX_BODY_BYTES", "MaxBodyBytes"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			r.Fail("MAX_BODY_BYTES", "%q must be a positive number of bytes", v)
		} else {
			c.MaxBodyBytes = n
		}
	}
	c.LogLevel = r.LogLevel()
	return c
}

// Verifier builds the hardened signature verifier from the two signing keys.
func (c ReceiverConfig) Verifier() (*qstash.Verifier, error) {
	return qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: c.CurrentSigningKey, NextSigningKey: c.NextSigningKey})
}
