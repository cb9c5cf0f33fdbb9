package lambdasvc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
	"github.com/aws/smithy-go"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdasvc"
	"github.com/outbox-relay/outbox-relay/v3/internal/lambdatest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
)

var tmpDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lambdasvc-")
	if err != nil {
		panic(err)
	}
	tmpDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildDir is a fresh directory for one bootstrap.
func buildDir() string {
	dir, err := os.MkdirTemp(tmpDir, "build-")
	if err != nil {
		panic(err)
	}
	return dir
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// bootstrap builds pkg (./functions/relay, ...) once per test binary, as lambdatest.Build
// builds the deployed bootstraps.
func bootstrap(t *testing.T, pkg string) string {
	t.Helper()
	lambdatest.RequireRIE(t)
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	p, err := lambdatest.Build(context.Background(), pkg, buildDir())
	if err != nil {
		t.Fatal(err)
	}
	built[pkg] = p
	return p
}

// client is a Lambda client on the service at url with dummy credentials; retries: the
// SDK's attempts per call (0: its default).
func client(url string, attempts int) *lambda.Client {
	return lambdasvc.Client(url, func(o *lambda.Options) { o.RetryMaxAttempts = attempts })
}

// results collects the service's invocation results.
type results struct {
	mu  sync.Mutex
	all []lambdasvc.Result
}

func (r *results) add(res lambdasvc.Result) { r.mu.Lock(); r.all = append(r.all, res); r.mu.Unlock() }
func (r *results) get() []lambdasvc.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// start serves the echo function with cfg's settings and returns a Lambda client on it
// that does not retry (so a throttle is seen as such).
func start(t *testing.T, cfg lambdasvc.FunctionConfig) (*lambdasvc.Service, *lambda.Client, *results) {
	t.Helper()
	res := &results{}
	cfg.Name, cfg.Bootstrap, cfg.OnResult = "echo", bootstrap(t, "./internal/lambdasvc/testdata/echo"), res.add
	svc, err := lambdasvc.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc, client(svc.URL, 1), res
}

func invoke(t *testing.T, c *lambda.Client, typ types.InvocationType, payload string) (*lambda.InvokeOutput, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	return c.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("arn:aws:lambda:eu-west-1:123456789012:function:echo"), InvocationType: typ, Payload: []byte(payload)})
}

func TestSyncInvokeAnswersWithTheFunction(t *testing.T) {
	t.Parallel()
	_, c, _ := start(t, lambdasvc.FunctionConfig{})
	out, err := invoke(t, c, types.InvocationTypeRequestResponse, `{"id":7}`)
	if err != nil || out.StatusCode != 200 || string(out.Payload) != `{"id":7}` || out.FunctionError != nil {
		t.Fatalf("invoke: %+v %v", out, err)
	}
	out, err = invoke(t, c, types.InvocationTypeRequestResponse, `{"fail":"no such order"}`)
	if err != nil || out.FunctionError == nil || *out.FunctionError != "Unhandled" {
		t.Fatalf("failing invoke: %+v %v", out, err)
	}
}

// TestEventIsAcceptedAtOnce: an Event invoke is answered 202 before the function runs to
// its end, and runs after.
func TestEventIsAcceptedAtOnce(t *testing.T) {
	t.Parallel()
	_, c, res := start(t, lambdasvc.FunctionConfig{})
	out, err := invoke(t, c, types.InvocationTypeEvent, `{"sleep_ms":1500,"id":1}`)
	if err != nil || out.StatusCode != 202 {
		t.Fatalf("invoke: %+v %v", out, err)
	}
	if n := len(res.get()); n != 0 {
		t.Fatalf("202 came after the function ended (%d results)", n)
	}
	testwait.Eventually(t, 30*time.Second, func() bool { return len(res.get()) == 1 }, "the event run")
	if r := res.get()[0]; !r.Async || r.Err != nil || string(r.Body) != `{"sleep_ms":1500,"id":1}` {
		t.Fatalf("result %+v", r)
	}
}

// TestReservedConcurrencyThrottlesSyncInvokes: with every environment busy, a synchronous
// invoke gets 429 TooManyRequestsException, as from Lambda.
func TestReservedConcurrencyThrottlesSyncInvokes(t *testing.T) {
	t.Parallel()
	svc, c, _ := start(t, lambdasvc.FunctionConfig{ReservedConcurrency: 1})
	first := make(chan error, 1)
	go func() {
		_, err := invoke(t, c, types.InvocationTypeRequestResponse, `{"sleep_ms":3000}`)
		first <- err
	}()
	// The environment is the first invoke's from its start until its 3 s are over.
	testwait.Eventually(t, 20*time.Second, func() bool { return svc.Stats("echo").Environments == 1 }, "the first environment started")
	_, err := invoke(t, c, types.InvocationTypeRequestResponse, `{}`)
	var tooMany *types.TooManyRequestsException
	if !errors.As(err, &tooMany) {
		t.Fatalf("second invoke: %v, want TooManyRequestsException", err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if s := svc.Stats("echo"); s.Throttled != 1 || s.Environments != 1 || s.Sync != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestThrottledEventsAreRetried: events beyond the reserved concurrency wait and run one
// after the other in the one environment, none lost, none at once.
func TestThrottledEventsAreRetried(t *testing.T) {
	t.Parallel()
	svc, c, res := start(t, lambdasvc.FunctionConfig{ReservedConcurrency: 1, RetryBase: 100 * time.Millisecond})
	for i := range 3 {
		if out, err := invoke(t, c, types.InvocationTypeEvent, fmt.Sprintf(`{"sleep_ms":300,"id":%d}`, i)); err != nil || out.StatusCode != 202 {
			t.Fatalf("event %d: %+v %v", i, out, err)
		}
	}
	testwait.Eventually(t, 30*time.Second, func() bool { return len(res.get()) == 3 }, "the three events run")
	all := res.get()
	slices.SortFunc(all, func(a, b lambdasvc.Result) int { return a.Start.Compare(b.Start) })
	for i := 1; i < len(all); i++ {
		if all[i].Start.Before(all[i-1].End) {
			t.Fatalf("two invocations at once with a reserved concurrency of 1: %v", all)
		}
	}
	ids := map[int]bool{}
	for _, r := range all {
		var p struct{ ID int }
		_ = json.Unmarshal(r.Body, &p)
		ids[p.ID] = true
	}
	if s := svc.Stats("echo"); len(ids) != 3 || s.Retried == 0 || s.Environments != 1 || s.Async != 3 || s.Dropped != 0 {
		t.Fatalf("ids %v, stats %+v", ids, s)
	}
}

// TestThrottledEventAgesOut: an event still throttled at its maximum age is dropped.
func TestThrottledEventAgesOut(t *testing.T) {
	t.Parallel()
	svc, c, res := start(t, lambdasvc.FunctionConfig{ReservedConcurrency: 1, RetryBase: 100 * time.Millisecond, MaxEventAge: time.Second})
	if _, err := invoke(t, c, types.InvocationTypeEvent, `{"sleep_ms":4000,"id":1}`); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, func() bool { return svc.Stats("echo").Environments == 1 }, "the first environment started")
	if _, err := invoke(t, c, types.InvocationTypeEvent, `{"id":2}`); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, func() bool { return svc.Stats("echo").Dropped == 1 }, "the second event dropped")
	testwait.Eventually(t, 20*time.Second, func() bool { return len(res.get()) == 1 }, "the first event run")
}

// TestOneEnvironmentPerConcurrentInvoke: below the reserved concurrency, concurrent
// invokes run at once, each in an emulator of its own.
func TestOneEnvironmentPerConcurrentInvoke(t *testing.T) {
	t.Parallel()
	svc, c, res := start(t, lambdasvc.FunctionConfig{ReservedConcurrency: 2})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := invoke(t, c, types.InvocationTypeRequestResponse, `{"sleep_ms":1500}`)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	all := res.get()
	if s := svc.Stats("echo"); s.Environments != 2 || s.Throttled != 0 || len(all) != 2 || !all[0].Start.Before(all[1].End) || !all[1].Start.Before(all[0].End) {
		t.Fatalf("stats %+v, results %+v: want two environments at once", s, all)
	}
}

func TestUnknownFunction(t *testing.T) {
	t.Parallel()
	_, c, _ := start(t, lambdasvc.FunctionConfig{})
	_, err := c.Invoke(t.Context(), &lambda.InvokeInput{FunctionName: aws.String("nope")})
	var nf *types.ResourceNotFoundException
	var api smithy.APIError
	if !errors.As(err, &nf) && !(errors.As(err, &api) && api.ErrorCode() == "ResourceNotFoundException") {
		t.Fatalf("err = %v", err)
	}
}
