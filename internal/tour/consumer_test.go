package tour_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdatest"
	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

// TestOwnConsumerUnderRIE builds examples/consumer, a module of its own that only imports
// the project (a consumer's main, no edit of this repository), as a Lambda bootstrap, runs
// it under aws-lambda-rie behind an emulated Function URL with no PUBLIC_BASE_URL (as a
// function deployed with docs/consuming.md's SAM snippet runs), and relays two events to it
// through the local QStash: the good one is applied once, the bad one is refused for good.
func TestOwnConsumerUnderRIE(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds a Lambda bootstrap and runs it under aws-lambda-rie")
	}
	lambdatest.RequireRIE(t)
	root, err := lambdatest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	example := filepath.Join(root, "examples", "consumer")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	// Built as `sam build` builds a provided.al2023 Go function, in the example's module.
	bin := filepath.Join(t.TempDir(), "bootstrap")
	build := exec.CommandContext(ctx, "go", "build", "-tags", "lambda.norpc", "-trimpath", "-o", bin, ".")
	build.Dir = example
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build examples/consumer: %v\n%s", err, out)
	}

	db := pgtest.New(t) // processed_messages, as `outboxctl migrate up` leaves it
	schema, err := os.ReadFile(filepath.Join(example, "schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, string(schema)); err != nil {
		t.Fatalf("run examples/consumer/schema.sql: %v", err)
	}
	fn := lambdatest.Start(t, lambdatest.Options{Bootstrap: bin, Name: "OrdersConsumer", Timeout: 15 * time.Second, Env: map[string]string{
		"DATABASE_URL":               db.URL,
		"QSTASH_CURRENT_SIGNING_KEY": qstash.DevCurrentSigningKey,
		"QSTASH_NEXT_SIGNING_KEY":    qstash.DevNextSigningKey,
	}})
	fnURL := lambdatest.NewFunctionURL(fn)
	t.Cleanup(fnURL.Close)
	roots := x509.NewCertPool()
	roots.AddCert(fnURL.Certificate())
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig.RootCAs = roots
	qs := qstashtest.NewServer(qstashtest.Options{HTTPClient: &http.Client{Transport: tr, Timeout: time.Minute}, TimeScale: 0.0001})
	t.Cleanup(qs.Close)

	good, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "order:o-1", Payload: []byte(`{"order_id":"o-1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{Topic: "order.created", PartitionKey: "order:o-2", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	pub, err := qstash.NewPublisher(qstash.PublisherConfig{BaseURL: qs.URL, Token: qs.Token, DestinationBaseURL: fnURL.URL})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logtest.Buffer{}
	r, err := relay.New(db.Pool, pub, relay.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Drain(ctx); err != nil {
		t.Fatalf("drain: %v\n%s", err, logs)
	}
	if err := qs.WaitIdle(ctx); err != nil {
		t.Fatalf("wait for QStash's deliveries: %v", err)
	}

	statuses := map[string][]int{}
	for _, a := range qs.Attempts() {
		if a.FailureCallback || a.Callback {
			continue
		}
		key := "bad"
		if strings.Contains(a.URL, "outbox_id="+good.String()+"&") {
			key = "good"
		}
		statuses[key] = append(statuses[key], a.Status)
	}
	// The signed URL is the Function URL's own (https://<domainName>): a 401 here means the
	// consumer rebuilt another one.
	if len(statuses["good"]) != 1 || statuses["good"][0] != http.StatusOK {
		t.Fatalf("good event's deliveries answered %v, want one 200\n%s", statuses["good"], fn.Log())
	}
	if len(statuses["bad"]) != 1 || statuses["bad"][0] != webhook.StatusNonRetryable {
		t.Fatalf("bad event's deliveries answered %v, want one 489 (never retried)\n%s", statuses["bad"], fn.Log())
	}
	if n := db.Count(t, `SELECT count(*) FROM shipments WHERE order_id = 'o-1' AND outbox_id = $1`, good.String()); n != 1 {
		t.Fatalf("%d shipments for o-1, want 1", n)
	}
	if n := db.Count(t, `SELECT count(*) FROM processed_messages`); n != 1 {
		t.Fatalf("%d processed messages, want 1 (the bad event rolled back)", n)
	}
	if !strings.Contains(fn.Log(), "order.created needs an order_id") {
		t.Errorf("the consumer's log does not give the bad event's reason:\n%s", fn.Log())
	}
}

// translateScript runs AWS's SAM translator (aws-sam-translator, which cfn-lint brings) over
// a template, as `sam deploy` has CloudFormation do it, with CodeUri already uploaded.
const translateScript = `
import json, sys
from samtranslator.translator.translator import Translator
from samtranslator.parser import parser
from samtranslator.yaml_helper import yaml_parse
t = yaml_parse(open(sys.argv[1]).read())
for r in t["Resources"].values():
    if r["Type"] == "AWS::Serverless::Function":
        r["Properties"]["CodeUri"] = "s3://bucket/key"
out = Translator(managed_policy_map={}, sam_parser=parser.Parser()).translate(sam_template=t, parameter_values={})
json.dump(out, sys.stdout)
`

// TestConsumerTemplate: the SAM template docs/consuming.md shows for your own consumer is
// examples/consumer/template.yaml, byte for byte, and the SAM translator makes of it a
// function serving a public BUFFERED Function URL, which is what funcurl and QStash need.
func TestConsumerTemplate(t *testing.T) {
	t.Parallel()
	root, err := lambdatest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := filepath.Join(root, "examples", "consumer", "template.yaml")
	text, err := os.ReadFile(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	guide, err := os.ReadFile(filepath.Join(root, "docs", "consuming.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(guide), "```yaml\n"+string(text)+"```\n") {
		t.Error("docs/consuming.md does not show examples/consumer/template.yaml as it is")
	}

	py, err := exec.LookPath("python3")
	if err != nil || exec.Command(py, "-c", "import samtranslator").Run() != nil {
		prereq.Missing(t, "the SAM translator check needs python3 with aws-sam-translator (pip install 'cfn-lint==1.51.*')")
	}
	cmd := exec.Command(py, "-c", translateScript, tmpl)
	cmd.Env = append(os.Environ(), "AWS_DEFAULT_REGION=eu-west-1")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("SAM translator: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("SAM translator: %v", err)
	}
	var cfn struct {
		Resources map[string]struct {
			Type       string
			Properties map[string]any
		}
	}
	if err := json.Unmarshal(out, &cfn); err != nil {
		t.Fatal(err)
	}
	fn, url := cfn.Resources["ConsumerFunction"], cfn.Resources["ConsumerFunctionUrl"]
	if fn.Type != "AWS::Lambda::Function" || fn.Properties["Handler"] != "bootstrap" || fn.Properties["Runtime"] != "provided.al2023" {
		t.Errorf("ConsumerFunction: %s %v", fn.Type, fn.Properties)
	}
	if url.Type != "AWS::Lambda::Url" || url.Properties["AuthType"] != "NONE" || url.Properties["InvokeMode"] != "BUFFERED" {
		t.Errorf("ConsumerFunctionUrl: %s %v", url.Type, url.Properties)
	}
	public := false
	for _, r := range cfn.Resources {
		if r.Type == "AWS::Lambda::Permission" && r.Properties["Action"] == "lambda:InvokeFunctionUrl" && r.Properties["Principal"] == "*" {
			public = true
		}
	}
	if !public {
		t.Error("no public lambda:InvokeFunctionUrl permission: QStash's deliveries would get 403")
	}
}
