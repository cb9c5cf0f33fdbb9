package chaos_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/chaos"
	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// TestLogsCarryNoSecrets runs the pipeline under faults with every component logging at
// debug level into one buffer, sends forged and expired tokens to the webhook and the
// failure endpoint while it runs, and then scans the logs: no API token, signing key,
// token or signature, database password or payload may appear.
func TestLogsCarryNoSecrets(t *testing.T) {
	t.Parallel()
	url, password := withPassword(t, chaosDB(t), "pw-LEAK-7f3a")
	logs := &logtest.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	var secrets []string
	var sent sync.WaitGroup
	defer sent.Wait() // the forged requests report through t, which must outlive them
	opts := chaos.Options{DatabaseURL: url, Events: 600, Seed: chaosSeed(t), Relays: 2, Faults: chaos.DefaultFaults(), Logger: logger,
		OnStart: func(ep chaos.Endpoints) {
			secrets = append(secrets, ep.QStashToken, ep.CurrentKey, ep.NextKey, password)
			body := []byte(`{"order_id":"o-LEAKMARK","amount_cents":1,"currency":"EUR"}`)
			hook := ep.WebhookBaseURL + "/events/order.created"
			now := time.Now()
			tokens := map[string]string{
				"expired":   sign(t, ep.CurrentKey, hook, body, now.Add(-10*time.Minute)),
				"HS512":     qstashtest.Forge(jwt.SigningMethodHS512, []byte(ep.CurrentKey), hook, body, now),
				"wrong key": qstashtest.Forge(jwt.SigningMethodHS256, []byte("sig_wrongKEYmarker"), hook, body, now),
				"garbage":   "not.a.jwtMARKER",
				"callback":  qstashtest.Forge(jwt.SigningMethodHS256, []byte("sig_wrongKEYmarker"), ep.FailureURL, body, now),
			}
			for name, tok := range tokens {
				secrets = append(secrets, tok)
				if parts := strings.Split(tok, "."); len(parts) == 3 && len(parts[2]) > 8 {
					secrets = append(secrets, parts[2])
				}
				target := hook
				if name == "callback" {
					target = ep.FailureURL
				}
				sent.Go(func() {
					req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, target, bytes.NewReader(body))
					req.Header.Set("Upstash-Signature", tok)
					req.Header.Set("X-Outbox-Id", "424242")
					if resp, err := http.DefaultClient.Do(req); err == nil {
						resp.Body.Close()
						if resp.StatusCode != http.StatusUnauthorized {
							t.Errorf("%s token: status %d, want 401", name, resp.StatusCode)
						}
					}
				})
			}
			// A valid signature seen by the relay path: the delivery signatures are made
			// by the QStash server with these keys; the keys are in secrets already.
		},
	}
	rep := runChaosOn(t, opts)
	sent.Wait()
	out := logs.String()
	for _, want := range []string{"webhook signature rejected", `"relay":`} {
		if !strings.Contains(out, want) {
			t.Fatalf("logs lack %q: the capture missed a component (%d bytes)", want, len(out))
		}
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(out, s) {
			t.Errorf("logs contain a secret or token: %.24q…", s)
		}
	}
	// Every produced payload carries "order_id":"c-..., the forged one a marker; neither may
	// be logged, as raw JSON or as an escaped string.
	for _, s := range []string{`"order_id":"c-`, `order_id\":\"c-`, "LEAKMARK", `Upstash-Signature":"ey`, `Upstash-Signature\":\"ey`} {
		if strings.Contains(out, s) {
			i := strings.Index(out, s)
			t.Errorf("logs contain %q (a payload or signature): …%s…", s, out[max(0, i-200):min(len(out), i+100)])
		}
	}
	t.Logf("scanned %d bytes of logs from %d events, %d faults", len(out), rep.Events, sum(rep.Faults))
}

func sum(m map[string]int64) (n int64) {
	for _, v := range m {
		n += v
	}
	return n
}

func sign(t *testing.T, key, url string, body []byte, at time.Time) string {
	t.Helper()
	s, err := qstash.Sign(key, url, body, at)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// withPassword returns dsn with a password the logs must never show: its own when it has one
// (a server that checks passwords needs it), else marker (trust auth ignores it).
func withPassword(t *testing.T, dsn, marker string) (string, string) {
	t.Helper()
	u, err := neturl.Parse(dsn)
	if err != nil || u.User == nil {
		t.Fatalf("DATABASE_URL %q: want a postgres:// URL with a user (%v)", dsn, err)
	}
	if p, ok := u.User.Password(); ok && p != "" {
		return dsn, p
	}
	u.User = neturl.UserPassword(u.User.Username(), marker)
	return u.String(), marker
}
