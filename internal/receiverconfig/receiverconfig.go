// Package receiverconfig reads the settings the two QStash receivers (the webhook and the
// failure-callback recorder) have in common, so both report the same problems in the same
// words. Each receiver adds its own variables (PUBLIC_BASE_URL, FAILURE_PUBLIC_URL) on top.
package receiverconfig

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/pkg/qstash"
)

// Config is what a receiver needs besides its own URL.
type Config struct {
	DatabaseURL       string
	CurrentSigningKey string
	NextSigningKey    string
	// MaxBodyBytes is MAX_BODY_BYTES, or the receiver's default.
	MaxBodyBytes int64
	LogLevel     slog.Level
	// MetricsNamespace is METRICS_NAMESPACE (empty: metrics.DefaultNamespace).
	MetricsNamespace string
	// ListenAddr is LISTEN_ADDR: serve over net/http instead of as a Lambda.
	ListenAddr string
}

// FromEnv reads DATABASE_URL, QSTASH_CURRENT_SIGNING_KEY, QSTASH_NEXT_SIGNING_KEY,
// MAX_BODY_BYTES, LOG_LEVEL, METRICS_NAMESPACE and LISTEN_ADDR through getenv and returns
// every problem at once, joined. No message repeats a value that may hold a secret.
func FromEnv(getenv func(string) string, defaultMaxBodyBytes int64) (Config, error) {
	c := Config{
		DatabaseURL:       getenv("DATABASE_URL"),
		CurrentSigningKey: getenv("QSTASH_CURRENT_SIGNING_KEY"),
		NextSigningKey:    getenv("QSTASH_NEXT_SIGNING_KEY"),
		MaxBodyBytes:      defaultMaxBodyBytes,
		MetricsNamespace:  getenv("METRICS_NAMESPACE"),
		ListenAddr:        getenv("LISTEN_ADDR"),
	}
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("DATABASE_URL is not set (postgres://user:pass@host:5432/db?sslmode=require)"))
	} else if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		// pgx's parse errors mask the password.
		errs = append(errs, fmt.Errorf("DATABASE_URL is invalid: %w", err))
	}
	if c.CurrentSigningKey == "" {
		errs = append(errs, errors.New("QSTASH_CURRENT_SIGNING_KEY is not set (QStash console, Signing keys)"))
	}
	if c.NextSigningKey == "" {
		errs = append(errs, errors.New("QSTASH_NEXT_SIGNING_KEY is not set (QStash console, Signing keys; an empty key would accept forged tokens)"))
	}
	if v := getenv("MAX_BODY_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("MAX_BODY_BYTES %q must be a positive number of bytes", v))
		}
		c.MaxBodyBytes = n
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(strings.ToLower(v))); err != nil {
			errs = append(errs, fmt.Errorf("LOG_LEVEL %q must be debug, info, warn or error", v))
		}
	}
	return c, errors.Join(errs...)
}

// Verifier builds the hardened signature verifier from the two signing keys.
func (c Config) Verifier() (*qstash.Verifier, error) {
	return qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: c.CurrentSigningKey, NextSigningKey: c.NextSigningKey})
}
