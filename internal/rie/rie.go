// Package rie runs a built Lambda bootstrap under the AWS Lambda Runtime Interface
// Emulator (aws-lambda-rie, what `sam local invoke` runs inside its container) without
// Docker, and invokes it over the emulator's HTTP API: for the tests (package lambdatest)
// and the local Lambda service (package lambdasvc).
//
// The emulator has three habits a caller must respect: it answers function errors and
// timeouts with HTTP 200 (so Invoke parses the body: see Response.Err), it crashes on
// concurrent invokes (so Function serializes them), and it forwards its whole environment
// to the function (so Launch passes an explicit one).
package rie

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
)

// InvokePath is the emulator's invoke endpoint.
const InvokePath = "/2015-03-31/functions/function/invocations"

// Path finds aws-lambda-rie: $AWS_LAMBDA_RIE, then $PATH, then $(go env GOPATH)/bin,
// where `go install github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@latest`
// puts it.
func Path() (string, error) {
	if p := os.Getenv("AWS_LAMBDA_RIE"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("aws-lambda-rie"); err == nil {
		return p, nil
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			p := filepath.Join(dir, "bin", "aws-lambda-rie")
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	return "", errors.New("aws-lambda-rie not found (go install github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@latest)")
}

// ModuleRoot returns the directory of the enclosing go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("find module root: not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}

// Build compiles pkg (a path such as ./functions/relay, relative to the module root) for
// the host, with the flags the deployed bootstrap uses except the target platform, into
// dir/bootstrap, and returns its path.
func Build(ctx context.Context, pkg, dir string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "bootstrap")
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "lambda.norpc", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// Options configures Launch.
type Options struct {
	// Bootstrap is the executable to run.
	Bootstrap string
	// Name is AWS_LAMBDA_FUNCTION_NAME. Default "function".
	Name string
	// Timeout is AWS_LAMBDA_FUNCTION_TIMEOUT, rounded down to whole seconds (minimum 1).
	// Default 30s.
	Timeout time.Duration
	// Env is the function's environment, on top of a minimal base (PATH, HOME, a region
	// and dummy credentials); nothing else from the test process leaks in.
	Env map[string]string
	// Log receives the emulator's and the function's output. Default: kept and written to
	// the test log if the test fails.
	Log io.Writer
}

// Function is a bootstrap running under aws-lambda-rie.
type Function struct {
	// URL is the emulator's base URL; invoke at URL + InvokePath.
	URL string

	cmd    *exec.Cmd
	mu     sync.Mutex // one invoke at a time: the emulator crashes on concurrent ones
	client *http.Client
	log    *logtest.Buffer
	done   chan struct{}
	err    error
}

// Launch runs opts.Bootstrap under the emulator at Path on two free loopback ports and
// waits until it accepts connections. The caller stops it with Stop; a nil opts.Log keeps
// the output for Log only.
func Launch(opts Options) (*Function, error) {
	p, err := Path()
	if err != nil {
		return nil, err
	}
	return start(p, opts)
}

// Exited reports whether the emulator has exited (crashed, or stopped).
func (f *Function) Exited() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// Stop stops the emulator and its function, and waits for them to exit.
func (f *Function) Stop() { f.stop() }

func start(rie string, opts Options) (*Function, error) {
	if opts.Name == "" {
		opts.Name = "function"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	secs := max(int(opts.Timeout/time.Second), 1)
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	f := &Function{URL: "http://" + addrs[0], log: &logtest.Buffer{}, done: make(chan struct{})}
	f.client = &http.Client{Timeout: opts.Timeout + 30*time.Second}
	var out io.Writer = f.log
	if opts.Log != nil {
		out = io.MultiWriter(f.log, opts.Log)
	}
	env := map[string]string{
		"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"),
		"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1",
		"AWS_ACCESS_KEY_ID": "AKIDLAMBDATEST", "AWS_SECRET_ACCESS_KEY": "lambdatest",
		"AWS_LAMBDA_FUNCTION_NAME": opts.Name, "AWS_LAMBDA_FUNCTION_TIMEOUT": strconv.Itoa(secs),
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256",
	}
	for k, v := range opts.Env {
		env[k] = v
	}
	f.cmd = exec.Command(rie,
		"--runtime-interface-emulator-address", addrs[0],
		"--runtime-api-address", addrs[1],
		"--log-level", "info",
		opts.Bootstrap)
	f.cmd.Dir = filepath.Dir(opts.Bootstrap)
	for k, v := range env {
		f.cmd.Env = append(f.cmd.Env, k+"="+v)
	}
	f.cmd.Stdout, f.cmd.Stderr = out, out
	if err := f.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start aws-lambda-rie: %w", err)
	}
	go func() { f.err = f.cmd.Wait(); close(f.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addrs[0], 200*time.Millisecond)
		if err == nil {
			c.Close()
			return f, nil
		}
		select {
		case <-f.done:
			return nil, fmt.Errorf("aws-lambda-rie exited at start (%v):\n%s", f.err, f.log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			f.stop()
			return nil, fmt.Errorf("aws-lambda-rie not listening on %s after 10s:\n%s", addrs[0], f.log.String())
		}
	}
}

// Log returns everything the emulator and the function wrote so far.
func (f *Function) Log() string { return f.log.String() }

func (f *Function) stop() {
	select {
	case <-f.done:
		return
	default:
	}
	_ = f.cmd.Process.Signal(os.Interrupt)
	select {
	case <-f.done:
	case <-time.After(5 * time.Second):
		_ = f.cmd.Process.Kill()
		<-f.done
	}
}

// Response is the emulator's answer to one invoke.
type Response struct {
	Status int
	Body   []byte
}

// FunctionError is a handler error or a runtime failure reported in a 200 response body.
type FunctionError struct {
	Message string `json:"errorMessage"`
	Type    string `json:"errorType"`
}

func (e *FunctionError) Error() string { return e.Type + ": " + e.Message }

// Err reports a failed invocation the emulator answered with HTTP 200: a handler error
// ({"errorMessage","errorType"}) or a timeout ("Task timed out after N.00 seconds").
func (r Response) Err() error {
	if r.Status != http.StatusOK {
		return fmt.Errorf("emulator answered %d: %s", r.Status, r.Body)
	}
	body := bytes.TrimSpace(r.Body)
	if bytes.HasPrefix(body, []byte("Task timed out")) {
		return &FunctionError{Message: string(body), Type: "TimeoutError"}
	}
	var fe FunctionError
	if json.Unmarshal(body, &fe) == nil && fe.Type != "" && fe.Message != "" {
		return &fe
	}
	return nil
}

// Decode unmarshals a successful response body into v.
func (r Response) Decode(v any) error {
	if err := r.Err(); err != nil {
		return err
	}
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("decode response %.200s: %w", r.Body, err)
	}
	return nil
}

// Invoke sends payload as the event and returns the emulator's response. Invocations are
// serialized.
func (f *Function) Invoke(ctx context.Context, payload []byte) (Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+InvokePath, bytes.NewReader(payload))
	if err != nil {
		return Response{}, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("invoke: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, fmt.Errorf("read invoke response: %w", err)
	}
	return Response{Status: resp.StatusCode, Body: body}, nil
}

// freeAddrs reserves n loopback ports and releases them for the emulator to bind. Another
// process could take one in between; the emulator then fails to start and says so.
func freeAddrs(n int) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserve port: %w", err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}
