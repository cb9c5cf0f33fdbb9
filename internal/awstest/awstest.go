// Package awstest gives tests the real AWS APIs locally: moto_server (the server of the moto
// project, an emulator of Secrets Manager, SSM Parameter Store, CloudWatch, STS and more over
// their real wire protocols), started once per test binary on a loopback port.
//
// Each test gets an Account: an AWS account of its own on that server (moto keeps one set of
// backends per account id, which the Account's endpoint sets on every request), so tests in
// parallel may use the same secret and parameter names without seeing each other's. The
// Account's endpoint is a pass-through to moto that also counts requests per operation, so
// a test can say how often its code called AWS. Point the SDK at it with Config (in process)
// or Env (AWS_ENDPOINT_URL and friends, for a subprocess such as a Lambda under
// aws-lambda-rie), and seed it with the real SDK clients (CreateSecret, PutParameter).
//
// A package whose tests call New runs them through Main:
//
//	func TestMain(m *testing.M) { os.Exit(awstest.Main(m)) }
//
// Without moto_server (pip install 'moto[server]'; the CI image has it) a test that calls
// New is skipped, and fails under CI.
package awstest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"

	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
)

// Region and the dummy credentials every Account uses. moto accepts any signature; the SDK
// only needs something to sign with.
const (
	Region          = "eu-west-1"
	AccessKeyID     = "AKIAMOTOTESTING00000"
	SecretAccessKey = "moto-does-not-check-signatures"
)

// Operations, as the X-Amz-Target header names them, for Account.Requests.
const (
	TargetGetSecretValue = "secretsmanager.GetSecretValue"
	TargetGetParameters  = "AmazonSSM.GetParameters"
)

// accountHeader selects moto's backends for one account (moto's own extension).
const accountHeader = "X-Moto-Account-Id"

// startTimeout bounds moto_server's start: it is up in about a second on an idle machine.
const startTimeout = 60 * time.Second

var (
	inMain   atomic.Bool
	mu       sync.Mutex
	server   *motoServer
	startErr error
	accounts atomic.Int64
)

// Main runs the package's tests (m.Run) and stops moto_server, if a test started it,
// after them. It returns m.Run's exit code.
func Main(m *testing.M) int {
	inMain.Store(true)
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if server != nil {
		server.stop()
	}
	return code
}

// Account is one test's AWS account on the shared moto_server.
type Account struct {
	// URL is the account's endpoint (AWS_ENDPOINT_URL), e.g. http://127.0.0.1:40123.
	URL string
	// ID is the 12-digit account id, as it appears in ARNs.
	ID string
	// Config is an SDK configuration for the account: Region, the dummy credentials and
	// URL as the base endpoint.
	Config aws.Config
	// SecretsManager and SSM are clients over Config, for seeding.
	SecretsManager *secretsmanager.Client
	SSM            *ssm.Client

	mu       sync.Mutex
	requests map[string]int
}

// New returns a fresh account on the package's moto_server, starting the server on first
// use. Without moto_server the test is skipped, or fails under CI. The account's
// endpoint closes when the test ends.
func New(tb testing.TB) *Account {
	tb.Helper()
	if !inMain.Load() {
		// Without Main nothing stops the server: it would outlive the test binary.
		tb.Fatal("awstest: the package's TestMain must run its tests through awstest.Main: func TestMain(m *testing.M) { os.Exit(awstest.Main(m)) }")
	}
	base, err := shared()
	if err != nil {
		prereq.Missing(tb, "%v", err)
	}
	a := &Account{ID: fmt.Sprintf("%012d", 100_000_000_000+accounts.Add(1)), requests: map[string]int{}}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(base)
		r.Out.Header.Set(accountHeader, a.ID)
	}}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.requests[r.Header.Get("X-Amz-Target")]++
		a.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	tb.Cleanup(front.Close)
	a.URL = front.URL
	a.Config = Config(a.URL)
	a.SecretsManager = secretsmanager.NewFromConfig(a.Config)
	a.SSM = ssm.NewFromConfig(a.Config)
	return a
}

// Config is an AWS config with the Region and dummy credentials every Account uses, its
// base endpoint endpoint unless that is empty: for tests that need a config but no server,
// or a server of their own (one that is down, say).
func Config(endpoint string) aws.Config {
	c := aws.Config{Region: Region, Credentials: credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, "")}
	if endpoint != "" {
		c.BaseEndpoint = aws.String(endpoint)
	}
	return c
}

// Env is the environment that points a process's AWS SDK at the account.
func (a *Account) Env() map[string]string {
	return map[string]string{
		"AWS_ENDPOINT_URL":      a.URL,
		"AWS_REGION":            Region,
		"AWS_DEFAULT_REGION":    Region,
		"AWS_ACCESS_KEY_ID":     AccessKeyID,
		"AWS_SECRET_ACCESS_KEY": SecretAccessKey,
	}
}

// Requests returns how many requests for target (e.g. TargetGetSecretValue) the account
// has received, seeding included.
func (a *Account) Requests(target string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests[target]
}

// CreateSecret creates a Secrets Manager secret holding value and returns its ARN.
func (a *Account) CreateSecret(tb testing.TB, name, value string) string {
	tb.Helper()
	out, err := a.SecretsManager.CreateSecret(context.Background(), &secretsmanager.CreateSecretInput{
		Name: aws.String(name), SecretString: aws.String(value),
	})
	if err != nil {
		tb.Fatalf("awstest: create secret %s: %v", name, err)
	}
	return aws.ToString(out.ARN)
}

// PutSecretValue makes value the secret's current version (AWSCURRENT), as a rotation's
// last step does.
func (a *Account) PutSecretValue(tb testing.TB, id, value string) {
	tb.Helper()
	if _, err := a.SecretsManager.PutSecretValue(context.Background(), &secretsmanager.PutSecretValueInput{
		SecretId: aws.String(id), SecretString: aws.String(value),
	}); err != nil {
		tb.Fatalf("awstest: put secret value %s: %v", id, err)
	}
}

// PutParameter creates or overwrites the SecureString parameter name.
func (a *Account) PutParameter(tb testing.TB, name, value string) {
	tb.Helper()
	if _, err := a.SSM.PutParameter(context.Background(), &ssm.PutParameterInput{
		Name: aws.String(name), Value: aws.String(value), Type: ssmtypes.ParameterTypeSecureString, Overwrite: aws.Bool(true),
	}); err != nil {
		tb.Fatalf("awstest: put parameter %s: %v", name, err)
	}
}

// shared returns the base URL of the package's moto_server, starting it on first use. A
// failed start is reported to every later caller without trying again.
func shared() (*url.URL, error) {
	mu.Lock()
	defer mu.Unlock()
	if server == nil && startErr == nil {
		server, startErr = start()
	}
	if startErr != nil {
		return nil, startErr
	}
	return server.url, nil
}

type motoServer struct {
	url  *url.URL
	cmd  *exec.Cmd
	done chan struct{}
}

// listening is the line werkzeug prints once its socket is bound; with -p 0 it names the
// port the kernel chose, so there is no race for a free port.
var listening = regexp.MustCompile(`Running on (http://127\.0\.0\.1:\d+)`)

func start() (*motoServer, error) {
	path := os.Getenv("MOTO_SERVER")
	if path == "" {
		var err error
		if path, err = exec.LookPath("moto_server"); err != nil {
			return nil, errors.New("moto_server not found on PATH: pip install 'moto[server]' (moto 5.2; on the CI image it is preinstalled), or set MOTO_SERVER to its path")
		}
	}
	cmd := exec.Command(path, "-H", "127.0.0.1", "-p", "0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("start moto_server: %w", err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start moto_server: %w", err)
	}
	s := &motoServer{cmd: cmd, done: make(chan struct{})}
	found := make(chan string, 1)
	var head []string // the first lines, for an error when it never listens
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
				break
			}
			if len(head) < 20 {
				head = append(head, sc.Text())
			}
		}
		close(found)
		// werkzeug logs a line per request: read on, or a full pipe stalls the server.
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(s.done)
	}()
	var base string
	select {
	case base = <-found:
	case <-time.After(startTimeout):
	}
	if base == "" {
		s.stop()
		return nil, fmt.Errorf("start moto_server: no %q line within %v: %v", "Running on", startTimeout, head)
	}
	if s.url, err = url.Parse(base); err != nil {
		s.stop()
		return nil, fmt.Errorf("start moto_server: %w", err)
	}
	if err := s.waitAnswering(); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// waitAnswering waits until moto answers HTTP (its dashboard's data, a cheap GET).
func (s *motoServer) waitAnswering() error {
	deadline := time.Now().Add(startTimeout)
	for {
		resp, err := http.Get(s.url.String() + "/moto-api/data.json")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("start moto_server: %s does not answer: %w", s.url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *motoServer) stop() {
	_ = s.cmd.Process.Kill()
	<-s.done
}
