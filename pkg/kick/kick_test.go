package kick_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
)

// invokeAPI is the Lambda Invoke API over real HTTP: POST
// /2015-03-31/functions/{name}/invocations. answer picks the status of the n-th request
// (0-based); nil answers 202. gate, when set, holds every request until it is closed.
type invokeAPI struct {
	*httptest.Server
	answer   func(n int) int
	gate     chan struct{}
	mu       sync.Mutex
	requests []invokeRequest
	inFlight atomic.Int32
	maxIn    atomic.Int32
}

// kickPayload is the relay's reading of a kick's payload.
type kickPayload struct {
	Task   string    `json:"task"`
	SentAt time.Time `json:"sent_at"`
}

type invokeRequest struct {
	path, invocationType string
	payload              kickPayload
}

func newInvokeAPI(t *testing.T, answer func(n int) int) *invokeAPI {
	t.Helper()
	api := &invokeAPI{answer: answer}
	api.Server = httptest.NewServer(http.HandlerFunc(api.serve))
	t.Cleanup(api.Close)
	return api
}

func (a *invokeAPI) serve(w http.ResponseWriter, r *http.Request) {
	n := a.inFlight.Add(1)
	defer a.inFlight.Add(-1)
	for m := a.maxIn.Load(); n > m && !a.maxIn.CompareAndSwap(m, n); m = a.maxIn.Load() {
	}
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/2015-03-31/functions/") || !strings.HasSuffix(r.URL.Path, "/invocations") {
		http.Error(w, "not the Invoke API", http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var p kickPayload
	_ = json.Unmarshal(body, &p)
	a.mu.Lock()
	i := len(a.requests)
	a.requests = append(a.requests, invokeRequest{r.URL.Path, r.Header.Get("X-Amz-Invocation-Type"), p})
	a.mu.Unlock()
	if a.gate != nil {
		<-a.gate
	}
	status := http.StatusAccepted
	if a.answer != nil {
		status = a.answer(i)
	}
	switch status {
	case http.StatusTooManyRequests:
		w.Header().Set("X-Amzn-Errortype", "TooManyRequestsException")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"Reason":"ReservedFunctionConcurrentInvocationLimitExceeded","Type":"User","message":"Rate Exceeded."}`)
	case http.StatusAccepted:
		w.WriteHeader(status)
	default:
		w.Header().Set("X-Amzn-Errortype", "ServiceException")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"message":"boom"}`)
	}
}

func (a *invokeAPI) got() []invokeRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]invokeRequest(nil), a.requests...)
}

// client is a Lambda client on api with dummy credentials.
func client(api *invokeAPI) *lambda.Client {
	return lambda.NewFromConfig(aws.Config{
		Region:      "eu-west-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDLOCAL", "local", ""),
	}, func(o *lambda.Options) { o.BaseEndpoint = aws.String(api.URL) })
}

func newKicker(t *testing.T, api *invokeAPI, cfg kick.Config) (*kick.Kicker, *logtest.Buffer) {
	t.Helper()
	var logs *logtest.Buffer
	cfg.Function = "relay-fn"
	cfg.Logger, logs = logtest.New()
	cfg.Client = client(api)
	k, err := kick.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close(context.Background()) })
	return k, logs
}

func TestKickSendsAnAsynchronousInvoke(t *testing.T) {
	t.Parallel()
	api := newInvokeAPI(t, nil)
	k, _ := newKicker(t, api, kick.Config{})
	before := time.Now()
	k.Kick()
	testwait.Eventually(t, 10*time.Second, func() bool { return k.Stats().Sent == 1 }, "the kick accepted")
	r := api.got()
	if len(r) != 1 || r[0].path != "/2015-03-31/functions/relay-fn/invocations" || r[0].invocationType != "Event" ||
		r[0].payload.Task != "kick" || r[0].payload.SentAt.Before(before.Add(-time.Millisecond)) || r[0].payload.SentAt.After(time.Now()) {
		t.Fatalf("requests %+v", r)
	}
}

// TestKickCoalesces: while a kick is in flight, every other Kick returns at once and adds
// no request; the accepted kick covers them (they came within Interval of its start).
func TestKickCoalesces(t *testing.T) {
	t.Parallel()
	api := newInvokeAPI(t, nil)
	api.gate = make(chan struct{})
	k, _ := newKicker(t, api, kick.Config{Interval: time.Minute})
	var wg sync.WaitGroup
	start := time.Now()
	for range 100 {
		wg.Add(1)
		go func() { defer wg.Done(); k.Kick() }()
	}
	wg.Wait()
	// The Invoke API holds the request: a Kick that waited for it would not be here.
	if el := time.Since(start); el > time.Second {
		t.Fatalf("100 Kick calls took %v with the invoke held: Kick blocks", el)
	}
	testwait.Eventually(t, 10*time.Second, func() bool { return len(api.got()) == 1 }, "the one kick to reach the API")
	close(api.gate)
	testwait.Eventually(t, 10*time.Second, func() bool { return k.Stats().Sent == 1 }, "the kick accepted")
	k.Kick() // within Interval of the accepted kick: covered
	if err := k.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s := k.Stats(); len(api.got()) != 1 || s.Requested != 101 || s.Sent != 1 || s.Skipped != 100 || api.maxIn.Load() != 1 {
		t.Fatalf("stats %+v, %d requests, %d at once", s, len(api.got()), api.maxIn.Load())
	}
}

// TestKickRateIsBounded: a producer that kicks without pause sends at most one invoke per
// Interval, one at a time.
func TestKickRateIsBounded(t *testing.T) {
	t.Parallel()
	api := newInvokeAPI(t, nil)
	const interval = 100 * time.Millisecond
	k, _ := newKicker(t, api, kick.Config{Interval: interval})
	start := time.Now()
	for time.Since(start) < time.Second {
		k.Kick()
		time.Sleep(time.Millisecond) // a producer committing a thousand times a second
	}
	elapsed := time.Since(start)
	n := len(api.got())
	if limit := int(elapsed/interval) + 1; n > limit || n < 2 {
		t.Fatalf("%d invokes in %v, want 2..%d (one per %v)", n, elapsed, limit, interval)
	}
	if api.maxIn.Load() != 1 {
		t.Fatalf("%d invokes in flight at once", api.maxIn.Load())
	}
}

// TestKickFailureIsLoggedAndCounted: a failing Invoke API costs the caller nothing; the
// failure is counted and logged, and the next Kick (after the spacing) tries again.
func TestKickFailureIsLoggedAndCounted(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	api := newInvokeAPI(t, func(int) int {
		if calls.Add(1) <= 3 { // the SDK's three attempts of the first kick
			return http.StatusInternalServerError
		}
		return http.StatusAccepted
	})
	k, logs := newKicker(t, api, kick.Config{Interval: 50 * time.Millisecond, Timeout: 30 * time.Second})
	k.Kick()
	testwait.Eventually(t, 30*time.Second, func() bool { return k.Stats().Failed == 1 }, "the failed kick counted")
	if !strings.Contains(logs.String(), "relay kick failed") {
		t.Fatalf("no warning logged: %s", logs)
	}
	k.Kick()
	testwait.Eventually(t, 10*time.Second, func() bool { return k.Stats().Sent == 1 }, "the next kick accepted")
}

// TestKickThrottled: 429 TooManyRequestsException (the function's reserved concurrency
// or the account's invoke rate) is retried by the SDK within Timeout; a kick throttled
// throughout is a counted failure.
func TestKickThrottled(t *testing.T) {
	t.Parallel()
	t.Run("then accepted", func(t *testing.T) {
		t.Parallel()
		api := newInvokeAPI(t, func(n int) int {
			if n == 0 {
				return http.StatusTooManyRequests
			}
			return http.StatusAccepted
		})
		k, _ := newKicker(t, api, kick.Config{Timeout: 30 * time.Second})
		k.Kick()
		testwait.Eventually(t, 30*time.Second, func() bool { return k.Stats().Sent == 1 }, "the throttled kick accepted on retry")
		if s := k.Stats(); s.Failed != 0 || len(api.got()) != 2 {
			t.Fatalf("stats %+v, %d requests", s, len(api.got()))
		}
	})
	t.Run("throughout", func(t *testing.T) {
		t.Parallel()
		api := newInvokeAPI(t, func(int) int { return http.StatusTooManyRequests })
		k, logs := newKicker(t, api, kick.Config{Timeout: 30 * time.Second})
		k.Kick()
		testwait.Eventually(t, 30*time.Second, func() bool { return k.Stats().Failed == 1 }, "the throttled kick counted")
		if !strings.Contains(logs.String(), "TooManyRequests") {
			t.Fatalf("the warning does not say it was throttled: %s", logs)
		}
	})
}

// TestCloseSendsTheOwedKick: a Kick that no accepted kick covers (the last one failed,
// the next waits for the spacing) is sent by Close instead of being dropped.
func TestCloseSendsTheOwedKick(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	api := newInvokeAPI(t, func(int) int {
		if calls.Add(1) == 1 {
			return http.StatusBadRequest // not retried by the SDK
		}
		return http.StatusAccepted
	})
	k, _ := newKicker(t, api, kick.Config{Interval: time.Hour})
	k.Kick()
	testwait.Eventually(t, 10*time.Second, func() bool { return k.Stats().Failed == 1 }, "the first kick refused")
	k.Kick() // waits an hour for the spacing
	if err := k.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s := k.Stats(); s.Sent != 1 || len(api.got()) != 2 {
		t.Fatalf("stats %+v, %d requests", s, len(api.got()))
	}
}

// TestNewFromEnvHonoursTheEndpointOverride: the standard AWS_ENDPOINT_URL_LAMBDA points the
// kicker at a local Invoke API.
func TestNewFromEnvHonoursTheEndpointOverride(t *testing.T) {
	api := newInvokeAPI(t, nil)
	t.Setenv("AWS_ENDPOINT_URL_LAMBDA", api.URL)
	t.Setenv("AWS_REGION", "eu-west-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDLOCAL")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	k, err := kick.New(t.Context(), kick.Config{Function: "relay-fn"})
	if err != nil {
		t.Fatal(err)
	}
	k.Kick()
	if err := k.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s := k.Stats(); s.Sent != 1 || len(api.got()) != 1 {
		t.Fatalf("stats %+v, requests %+v", s, api.got())
	}
}

func TestNewRefusesAnEmptyFunction(t *testing.T) {
	t.Parallel()
	if _, err := kick.New(t.Context(), kick.Config{}); err == nil || !strings.Contains(err.Error(), "RelayFunctionArn") {
		t.Fatalf("err = %v", err)
	}
}
