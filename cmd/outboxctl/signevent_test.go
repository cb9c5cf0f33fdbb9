package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

func verifier(t *testing.T) *qstash.Verifier {
	t.Helper()
	v, err := qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: qstash.DevCurrentSigningKey, NextSigningKey: qstash.DevNextSigningKey})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSignEventSignsTheURLTheReceiverRebuilds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		event, url string
		key        string
	}{
		{"webhook.json", "https://abcdefghijklmnopqrstuvwxyz234567.lambda-url.eu-west-1.on.aws/events/order.created?outbox_id=1001&generation=0", "current"},
		{"webhook.json", "https://abcdefghijklmnopqrstuvwxyz234567.lambda-url.eu-west-1.on.aws/events/order.created?outbox_id=1001&generation=0", "next"},
		{"failure.json", "https://zyxwvutsrqponmlkjihgfedcba765432.lambda-url.eu-west-1.on.aws/", "current"},
	} {
		var out, errOut bytes.Buffer
		e := env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}
		if err := runSignEvent(context.Background(), e, []string{"-in", filepath.Join("..", "..", "events", tt.event), "-key", tt.key}); err != nil {
			t.Fatalf("%s: %v %s", tt.event, err, errOut.String())
		}
		var ev struct {
			Headers map[string]string `json:"headers"`
			Body    string            `json:"body"`
			RawPath string            `json:"rawPath"`
		}
		if err := json.Unmarshal(out.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		if err := verifier(t).Verify(ev.Headers["upstash-signature"], tt.url, []byte(ev.Body)); err != nil {
			t.Errorf("%s (%s key): %v", tt.event, tt.key, err)
		}
		orig, _ := os.ReadFile(filepath.Join("..", "..", "events", tt.event))
		var before map[string]any
		_ = json.Unmarshal(orig, &before)
		var after map[string]any
		_ = json.Unmarshal(out.Bytes(), &after)
		delete(before["headers"].(map[string]any), "upstash-signature")
		delete(after["headers"].(map[string]any), "upstash-signature")
		b1, _ := json.Marshal(before)
		b2, _ := json.Marshal(after)
		if !bytes.Equal(b1, b2) {
			t.Errorf("%s: fields other than the signature changed", tt.event)
		}
	}
}

func TestSignFunctionURLEvent(t *testing.T) {
	t.Parallel()
	now := time.Now()
	body := []byte{0xff, 0x00, 'x'}
	ev := `{"version":"2.0","rawPath":"/events/a","rawQueryString":"x=1","isBase64Encoded":true,"body":"` +
		base64.StdEncoding.EncodeToString(body) + `","headers":{"Upstash-Signature":"old"},"requestContext":{"domainName":"d.example","timeEpoch":1796212800000}}`
	out, err := signFunctionURLEvent([]byte(ev), qstash.DevCurrentSigningKey, "", now)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	h := got["headers"].(map[string]any)
	if _, ok := h["Upstash-Signature"]; ok || len(h) != 1 {
		t.Errorf("headers %v: the old signature must be replaced, lowercased", h)
	}
	// The signature covers the decoded body and the query string.
	if err := verifier(t).Verify(h["upstash-signature"].(string), "https://d.example/events/a?x=1", body); err != nil {
		t.Errorf("verify: %v", err)
	}
	if !strings.Contains(string(out), "1796212800000") {
		t.Error("timeEpoch not kept exactly")
	}

	for name, bad := range map[string]string{
		"not JSON":      `{`,
		"not a URL ev":  `{"version":"1.0"}`,
		"no domain":     `{"version":"2.0","rawPath":"/x"}`,
		"bad base64":    `{"version":"2.0","rawPath":"/","isBase64Encoded":true,"body":"!!","requestContext":{"domainName":"d"}}`,
		"relative path": `{"version":"2.0","rawPath":"x","requestContext":{"domainName":"d"}}`,
	} {
		if _, err := signFunctionURLEvent([]byte(bad), qstash.DevCurrentSigningKey, "", now); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// -url overrides the rebuilt URL (receivers with PUBLIC_BASE_URL / FAILURE_CALLBACK_URL).
	out, err = signFunctionURLEvent([]byte(`{"version":"2.0","body":"{}"}`), qstash.DevNextSigningKey, "https://hooks.example.com/events/a", now)
	if err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal(out, &got)
	if err := verifier(t).Verify(got["headers"].(map[string]any)["upstash-signature"].(string), "https://hooks.example.com/events/a", []byte("{}")); err != nil {
		t.Errorf("-url: %v", err)
	}
}

func TestSignEventArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"-in", "x", "extra"}, {"-in", "../../events/webhook.json", "-key", "old"}} {
		var out, errOut bytes.Buffer
		err := runSignEvent(context.Background(), env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}, args)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != 2 || out.Len() != 0 {
			t.Errorf("%v: err %v, stdout %q; want exit 2 and nothing written", args, err, out.String())
		}
	}
	var out bytes.Buffer
	if err := runSignEvent(context.Background(), env{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}, []string{"-in", "/nonexistent.json"}); err == nil {
		t.Error("missing file accepted")
	}
}
