// Package lambdasvc is a local Lambda service: the Lambda Invoke API
// (POST /2015-03-31/functions/{FunctionName}/invocations) in front of built bootstraps run
// under aws-lambda-rie, so that code calling Lambda through aws-sdk-go-v2 (a producer's
// kick, AWS_ENDPOINT_URL_LAMBDA) meets the functions as deployed. A function may instead
// run in this process (FunctionConfig.Launch): the chaos run's relays, whose faults are
// injected from inside, behind the same API, concurrency and queue.
//
// Like Lambda, each concurrent execution environment is one emulator (the emulator runs
// one invocation at a time), started on demand up to the function's reserved
// concurrency and reused warm afterwards. A synchronous invoke (RequestResponse) that
// finds every environment busy is throttled: 429 TooManyRequestsException. An
// asynchronous one (Event) is answered 202 at once and queued; a queued event that finds
// every environment busy is retried with backoff, as Lambda retries throttled events,
// until it is older than the function's maximum event age, then dropped. Function errors
// of asynchronous events are not retried (the template's MaximumRetryAttempts: 0).
package lambdasvc

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/outbox-relay/outbox-relay/v3/internal/rie"
)

// Defaults for FunctionConfig.
const (
	DefaultTimeout     = 30 * time.Second
	DefaultMaxEventAge = time.Minute
	// DefaultRetryBase is the first wait of a throttled event; Lambda's is 1 s, doubling
	// up to 5 minutes.
	DefaultRetryBase = time.Second
	maxRetryWait     = 5 * time.Minute
)

// FunctionConfig is one function of the service.
type FunctionConfig struct {
	// Name is the function's name; invokes may name it by its ARN too
	// (arn:aws:lambda:<region>:<account>:function:<name>).
	Name string
	// Bootstrap is the built executable (rie.Build).
	Bootstrap string
	// Launch, when set instead of Bootstrap, starts an execution environment in this
	// process; the service uses it as it uses an emulator.
	Launch func() (Environment, error)
	// Env is the function's environment (rie.Options.Env).
	Env map[string]string
	// Timeout is the function timeout. Default DefaultTimeout.
	Timeout time.Duration
	// ReservedConcurrency caps its execution environments. Default 1.
	ReservedConcurrency int
	// MaxEventAge: a throttled asynchronous event older than this is dropped. Default
	// DefaultMaxEventAge (the template's MaximumEventAgeInSeconds).
	MaxEventAge time.Duration
	// RetryBase is the first wait before a throttled event is tried again; it doubles.
	// Default DefaultRetryBase.
	RetryBase time.Duration
	// Log receives every environment's emulator and function output, and the errors of
	// environments that failed to start. Nil: discarded.
	Log io.Writer
	// OnResult, if set, is called after each invocation with its payload, the function's
	// response (its body, or the error), and whether it was asynchronous.
	OnResult func(Result)
}

// Environment is one execution environment: the service runs one invocation at a time
// in it.
type Environment interface {
	// Invoke runs one invocation: the function's response, and its error (an error
	// document comes with a body) or the environment's (no body).
	Invoke(ctx context.Context, payload []byte) ([]byte, error)
	// Exited reports that the environment died: the service replaces it, as Lambda
	// replaces a runtime that crashed.
	Exited() bool
	// Stop ends the environment; the service calls it once it no longer uses it.
	Stop()
}

// emulator is an Environment of a built bootstrap under aws-lambda-rie.
type emulator struct{ *rie.Function }

func (e emulator) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	resp, err := e.Function.Invoke(ctx, payload)
	if err != nil {
		return nil, err
	}
	return resp.Body, resp.Err()
}

// Result is one invocation's outcome, for FunctionConfig.OnResult.
type Result struct {
	Function string
	Async    bool
	Payload  []byte
	Body     []byte
	Err      error
	// Start and End bound the invocation in its environment; Queued is when the service
	// accepted it.
	Queued, Start, End time.Time
}

// Stats counts what the service did for one function.
type Stats struct {
	// Sync and Async count invocations run to their end; Accepted counts asynchronous
	// events answered 202.
	Sync, Async, Accepted int64
	// Throttled counts synchronous invokes answered 429; Retried the retries of throttled
	// events; Dropped the events that aged out throttled.
	Throttled, Retried, Dropped int64
	// Environments is how many environments were started (cold starts).
	Environments int64
}

// Service is a running local Lambda service.
type Service struct {
	// URL is the Invoke API's base URL: AWS_ENDPOINT_URL_LAMBDA for a client.
	URL string

	srv   *http.Server
	ln    net.Listener
	funcs map[string]*function
	// wg tracks queued events, so Close waits for them; mu orders adding to it before
	// Close's wait (isClosed).
	mu       sync.Mutex
	isClosed bool
	wg       sync.WaitGroup
	closed   chan struct{}
}

// function is one function's environments and counters.
type function struct {
	cfg FunctionConfig

	mu      sync.Mutex
	idle    []Environment
	all     []Environment
	started int
	// stopped: the service closed; an environment started after it is stopped at once.
	stopped bool

	sync, async, accepted, throttled, retried, dropped, envs atomic.Int64
}

// Start serves fns on a loopback port. Environments start on the first invokes.
func Start(fns ...FunctionConfig) (*Service, error) {
	s := &Service{funcs: map[string]*function{}, closed: make(chan struct{})}
	for _, c := range fns {
		if c.Name == "" || (c.Bootstrap == "") == (c.Launch == nil) {
			return nil, errors.New("start lambda service: a function needs Name and one of Bootstrap or Launch")
		}
		c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
		c.ReservedConcurrency = cmp.Or(c.ReservedConcurrency, 1)
		c.MaxEventAge = cmp.Or(c.MaxEventAge, DefaultMaxEventAge)
		c.RetryBase = cmp.Or(c.RetryBase, DefaultRetryBase)
		if c.Log == nil {
			c.Log = io.Discard
		}
		s.funcs[c.Name] = &function{cfg: c}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("start lambda service: %w", err)
	}
	s.ln, s.URL = ln, "http://"+ln.Addr().String()
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Stats returns the counters of the function named name.
func (s *Service) Stats(name string) Stats {
	f := s.funcs[name]
	if f == nil {
		return Stats{}
	}
	return Stats{Sync: f.sync.Load(), Async: f.async.Load(), Accepted: f.accepted.Load(), Throttled: f.throttled.Load(),
		Retried: f.retried.Load(), Dropped: f.dropped.Load(), Environments: f.envs.Load()}
}

// Close stops accepting invokes, drops the events still waiting for an environment,
// waits for the invocations running, and stops every environment.
func (s *Service) Close() {
	s.mu.Lock()
	s.isClosed = true
	close(s.closed)
	s.mu.Unlock()
	_ = s.srv.Close()
	s.wg.Wait()
	for _, f := range s.funcs {
		f.mu.Lock()
		for _, e := range f.all {
			e.Stop()
		}
		f.all, f.idle, f.stopped = nil, nil, true
		f.mu.Unlock()
	}
}

const invokePrefix = "/2015-03-31/functions/"

func (s *Service) serve(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutPrefix(r.URL.Path, invokePrefix)
	if ok {
		name, ok = strings.CutSuffix(name, "/invocations")
	}
	if r.Method != http.MethodPost || !ok {
		apiError(w, http.StatusNotFound, "UnknownOperationException", "only POST "+invokePrefix+"{FunctionName}/invocations is served")
		return
	}
	// A name, a partial or full ARN, maybe with a qualifier: the name is what follows
	// "function:".
	if i := strings.LastIndex(name, "function:"); i >= 0 {
		name = name[i+len("function:"):]
	}
	name, _, _ = strings.Cut(name, ":")
	f := s.funcs[name]
	if f == nil {
		apiError(w, http.StatusNotFound, "ResourceNotFoundException", "Function not found: "+name)
		return
	}
	payload, err := io.ReadAll(io.LimitReader(r.Body, 6<<20+1))
	if err != nil || len(payload) > 6<<20 {
		apiError(w, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "payload larger than 6 MB or unreadable")
		return
	}
	switch t := r.Header.Get("X-Amz-Invocation-Type"); t {
	case "", "RequestResponse":
		s.invokeSync(w, f, payload)
	case "Event":
		if len(payload) > 1<<20 {
			apiError(w, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "asynchronous payload larger than 1 MB")
			return
		}
		if !s.enqueue(f, payload) {
			apiError(w, http.StatusServiceUnavailable, "ServiceException", "the local Lambda service is closing")
			return
		}
		w.WriteHeader(http.StatusAccepted)
	case "DryRun":
		w.WriteHeader(http.StatusNoContent)
	default:
		apiError(w, http.StatusBadRequest, "InvalidParameterValueException", fmt.Sprintf("X-Amz-Invocation-Type %q", t))
	}
}

// invokeSync runs payload in an idle environment, or answers 429 when none is free.
func (s *Service) invokeSync(w http.ResponseWriter, f *function, payload []byte) {
	env, err := f.acquire()
	if err != nil {
		apiError(w, http.StatusInternalServerError, "ServiceException", err.Error())
		return
	}
	if env == nil {
		f.throttled.Add(1)
		w.Header().Set("X-Amzn-Errortype", "TooManyRequestsException")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"Reason":"ReservedFunctionConcurrentInvocationLimitExceeded","Type":"User","message":"Rate Exceeded."}`)
		return
	}
	// Not the request's context: Lambda runs the function to its end whoever hangs up,
	// and an emulator still running an invocation must not take the next one.
	res := f.run(env, payload, time.Now(), false)
	f.sync.Add(1)
	if res.Err != nil && res.Body == nil {
		apiError(w, http.StatusInternalServerError, "ServiceException", res.Err.Error())
		return
	}
	if res.Err != nil {
		// A function error is a 200 with X-Amz-Function-Error, as Lambda answers it.
		w.Header().Set("X-Amz-Function-Error", "Unhandled")
	}
	w.Header().Set("X-Amz-Executed-Version", "$LATEST")
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(res.Body)
}

// enqueue accepts an asynchronous event for f, unless the service is closing.
func (s *Service) enqueue(f *function, payload []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.isClosed {
		return false
	}
	f.accepted.Add(1)
	s.wg.Add(1)
	go s.deliver(f, payload, time.Now())
	return true
}

// deliver runs a queued event, retrying while every environment is busy, until it is
// older than MaxEventAge.
func (s *Service) deliver(f *function, payload []byte, queued time.Time) {
	defer s.wg.Done()
	wait := f.cfg.RetryBase
	for {
		env, err := f.acquire()
		if err == nil && env != nil {
			f.run(env, payload, queued, true)
			f.async.Add(1)
			return
		}
		if err != nil {
			// Lambda retries an event whose environment failed to start as a throttled one;
			// the log says why.
			fmt.Fprintf(f.cfg.Log, "lambdasvc: %v; the event is retried\n", err)
		}
		if time.Since(queued)+wait > f.cfg.MaxEventAge {
			f.dropped.Add(1)
			return
		}
		f.retried.Add(1)
		select {
		case <-time.After(wait):
		case <-s.closed:
			f.dropped.Add(1)
			return
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// acquire takes an idle environment, or starts one below the reserved concurrency; nil
// (and no error) when all are busy.
func (f *function) acquire() (Environment, error) {
	f.mu.Lock()
	if n := len(f.idle); n > 0 {
		env := f.idle[n-1]
		f.idle = f.idle[:n-1]
		f.mu.Unlock()
		return env, nil
	}
	if f.started >= f.cfg.ReservedConcurrency {
		f.mu.Unlock()
		return nil, nil
	}
	f.started++ // held for the environment starting now
	f.mu.Unlock()
	env, err := f.launch()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.started--
		return nil, fmt.Errorf("start an environment of %s: %w", f.cfg.Name, err)
	}
	if f.stopped {
		env.Stop()
		return nil, fmt.Errorf("start an environment of %s: the service closed", f.cfg.Name)
	}
	f.envs.Add(1)
	f.all = append(f.all, env)
	return env, nil
}

// launch starts one environment: in this process, or an emulator of the bootstrap.
func (f *function) launch() (Environment, error) {
	if f.cfg.Launch != nil {
		return f.cfg.Launch()
	}
	e, err := rie.Launch(rie.Options{Bootstrap: f.cfg.Bootstrap, Name: f.cfg.Name, Timeout: f.cfg.Timeout, Env: f.cfg.Env, Log: f.cfg.Log})
	if err != nil {
		return nil, err
	}
	return emulator{e}, nil
}

// run invokes payload in env, returns env to the idle ones, and reports the result.
func (f *function) run(env Environment, payload []byte, queued time.Time, async bool) Result {
	res := Result{Function: f.cfg.Name, Async: async, Payload: payload, Queued: queued, Start: time.Now()}
	ictx, cancel := context.WithTimeout(context.Background(), f.cfg.Timeout+30*time.Second)
	res.Body, res.Err = env.Invoke(ictx, payload)
	cancel()
	res.End = time.Now()
	exited := env.Exited()
	if exited {
		// Stopped before its place is given up, so the environment that replaces it never
		// meets what it holds (an in-process environment's slot).
		env.Stop()
	}
	f.mu.Lock()
	if exited {
		// A crashed environment leaves: the next invoke starts a fresh one, as Lambda
		// replaces a failed one.
		f.all = slices.DeleteFunc(f.all, func(e Environment) bool { return e == env })
		f.started--
	} else {
		f.idle = append(f.idle, env)
	}
	f.mu.Unlock()
	if f.cfg.OnResult != nil {
		f.cfg.OnResult(res)
	}
	return res
}

// apiError answers as the Lambda API does: the error type in X-Amzn-Errortype and a JSON
// message.
func apiError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("X-Amzn-Errortype", typ)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]string{"Type": "User", "message": msg})
	_, _ = w.Write(b)
}

// Client is a Lambda client on the Invoke API at url (a Service's URL, or a front of it),
// with dummy credentials: what a producer's default client is once AWS_ENDPOINT_URL_LAMBDA
// points it here. optFns tune it further (retries, ...).
func Client(url string, optFns ...func(*lambda.Options)) *lambda.Client {
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("local", "local", "")}
	return lambda.NewFromConfig(cfg, append([]func(*lambda.Options){func(o *lambda.Options) { o.BaseEndpoint = aws.String(url) }}, optFns...)...)
}

// Schedule sends payload to the function named name as an asynchronous event every
// period, as EventBridge Scheduler does, until the returned function is called or the
// service closes.
func (s *Service) Schedule(name string, period time.Duration, payload []byte) (stop func(), err error) {
	f := s.funcs[name]
	if f == nil {
		return nil, fmt.Errorf("schedule %s: no such function", name)
	}
	done := make(chan struct{})
	var once sync.Once
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s.enqueue(f, payload)
			case <-done:
				return
			case <-s.closed:
				return
			}
		}
	}()
	return func() { once.Do(func() { close(done) }) }, nil
}
