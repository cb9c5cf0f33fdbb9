package envconfig

import (
	"errors"
	"log/slog"
	"strconv"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
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
	// fields maps the library fields these variables set to the variables (Reader.Sets), so
	// ByVariable can name the variable behind a handler's or verifier's own check.
	fields map[string]string
}

// ByVariable returns err, an error of the signature verifier or the handler built from c,
// with each *publish.ConfigError about a field one of c's variables sets reported as a
// *VarError naming that variable (a PUBLIC_BASE_URL the webhook refuses reads
// "PUBLIC_BASE_URL: webhook config PublicBaseURL: ..."); err as it is when there is none.
func (c ReceiverConfig) ByVariable(err error) error {
	if errs, mapped := byVariable(err, c.fields); mapped {
		return errors.Join(errs...)
	}
	return err
}

// ReadWebhook returns the reader of the webhook's configuration (through getenv, every
// missing or invalid variable reported at once); maxBody is its default body limit.
func ReadWebhook(maxBody int64) func(getenv func(string) string) (ReceiverConfig, error) {
	return func(getenv func(string) string) (ReceiverConfig, error) {
		return readReceiver(getenv, maxBody, "PUBLIC_BASE_URL", "https://hooks.example.com", "PublicBaseURL")
	}
}

// ReadFailure returns the reader of the failure-callback recorder's configuration, as
// ReadWebhook does the webhook's; maxBody is its default body limit. FAILURE_CALLBACK_URL
// is the same variable the relay publishes.
func ReadFailure(maxBody int64) func(getenv func(string) string) (ReceiverConfig, error) {
	return func(getenv func(string) string) (ReceiverConfig, error) {
		return readReceiver(getenv, maxBody, "FAILURE_CALLBACK_URL", "https://abc.lambda-url.eu-west-1.on.aws/", "FailureURL")
	}
}

// readReceiver reads a receiver's variables; its public URL is urlVar, which sets the
// handler's field urlField.
func readReceiver(getenv func(string) string, maxBody int64, urlVar, urlExample, urlField string) (ReceiverConfig, error) {
	r := NewReader(getenv)
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
	c.PublicURL = r.AbsoluteURL(urlVar, urlExample, urlField)
	c.fields = r.fields
	return c, r.Err()
}

// VerifierConfig is the signature verifier's configuration from the two signing keys; the
// caller adds how to re-read them (qstash.VerifierConfig.Reread) and its logger.
func (c ReceiverConfig) VerifierConfig() qstash.VerifierConfig {
	return qstash.VerifierConfig{CurrentSigningKey: c.CurrentSigningKey, NextSigningKey: c.NextSigningKey}
}
