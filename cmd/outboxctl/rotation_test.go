package main

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/awstest"
	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/outboxtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

func TestMain(m *testing.M) { os.Exit(awstest.Main(m)) }

// TestRelayProcessOutlivesATokenRotation: the long-lived relay never has a cold start, so
// a QStash token rotated in SSM (QSTASH_TOKEN_PARAM) and in QStash must be read again
// when QStash refuses the old one, as the relay Lambda does: events enqueued after the
// rotation are published by the same process, each with one attempt, after exactly one
// more parameter read. Then dlq sync runs with the same environment, the relay function's,
// and reads the token from the parameter too. The built binary runs with its AWS SDK
// pointed at moto_server.
func TestRelayProcessOutlivesATokenRotation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds outboxctl")
	}
	db := pgtest.New(t)
	aws := awstest.New(t)
	qs := qstashtest.NewTestServer(t, qstashtest.Options{})
	const param = "/outbox-relay/qstash/token"
	aws.PutParameter(t, param, qs.Token)

	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"DATABASE_URL=" + db.URL, "QSTASH_URL=" + qs.URL, "QSTASH_TOKEN_PARAM=" + param,
		"PUBLIC_BASE_URL=http://127.0.0.1:1/"}
	for k, v := range aws.Env() {
		env = append(env, k+"="+v)
	}
	cmd := exec.Command(buildCLI(t), "relay", "--listen", "127.0.0.1:0", "--retention-interval", "0", "--poll-interval", "100ms")
	cmd.Env = env
	var stderr logtest.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("relay's log:\n%s", stderr.String())
		}
	})

	outboxtest.Enqueue(t, db.Pool, outboxtest.Orders(0, 30, outboxtest.Mod(10)))
	testwait.Eventually(t, 30*time.Second, func() bool { return countRows(t, db, "dispatched_at IS NOT NULL") == 30 }, "events before the rotation dispatched")
	reads := aws.Requests(awstest.TargetGetParameters)

	aws.PutParameter(t, param, "rotated-token")
	qs.SetToken("rotated-token")
	outboxtest.Enqueue(t, db.Pool, outboxtest.Orders(30, 30, outboxtest.Mod(10)))
	testwait.Eventually(t, 30*time.Second, func() bool { return countRows(t, db, "dispatched_at IS NOT NULL") == 60 }, "events after the rotation dispatched")
	if n := countRows(t, db, "attempts <> 1"); n != 0 {
		t.Errorf("%d events took more than one attempt", n)
	}
	if n := aws.Requests(awstest.TargetGetParameters) - reads; n != 1 {
		t.Errorf("%d parameter reads after the rotation, want 1", n)
	}

	sync := exec.Command(cmd.Path, "dlq", "sync", "--json")
	sync.Env = env
	// The destination is unreachable: what QStash gave up on so far is in its DLQ.
	if out, err := sync.CombinedOutput(); err != nil || !strings.Contains(string(out), `"scanned":`) {
		t.Errorf("dlq sync with QSTASH_TOKEN_PARAM: %v\n%s", err, out)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if err != nil {
			t.Fatalf("relay exit after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay still running 30 s after SIGTERM\n%s", stderr.String())
	}
}
