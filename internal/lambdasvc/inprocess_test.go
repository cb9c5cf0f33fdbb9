package lambdasvc_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdasvc"
	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
)

// inProcess is an environment in this process: it answers its payload, fails on
// "fail", dies on "crash", and holds "queued" until hold is closed.
type inProcess struct {
	exited, stopped atomic.Bool
	entered, hold   chan struct{}
}

func (e *inProcess) Invoke(_ context.Context, payload []byte) ([]byte, error) {
	switch string(payload) {
	case `"queued"`:
		e.entered <- struct{}{}
		<-e.hold
	case `"fail"`:
		return []byte(`{"errorMessage":"failed","errorType":"errorString"}`), errors.New("failed")
	case `"crash"`:
		e.exited.Store(true)
		return nil, errors.New("Runtime.ExitError")
	}
	return payload, nil
}

func (e *inProcess) Exited() bool { return e.exited.Load() }
func (e *inProcess) Stop()        { e.stopped.Store(true) }

// TestInProcessEnvironments: a function launched in this process meets the service as an
// emulator does: answers, function errors, a throttle when its one environment is busy,
// and a crashed environment replaced (and stopped) at the next invoke.
func TestInProcessEnvironments(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		envs []*inProcess
	)
	launched := func() []*inProcess { mu.Lock(); defer mu.Unlock(); return slices.Clone(envs) }
	entered, hold := make(chan struct{}, 1), make(chan struct{})
	svc, err := lambdasvc.Start(lambdasvc.FunctionConfig{Name: "echo", ReservedConcurrency: 1,
		Launch: func() (lambdasvc.Environment, error) {
			e := &inProcess{entered: entered, hold: hold}
			mu.Lock()
			envs = append(envs, e)
			mu.Unlock()
			return e, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	c := client(svc.URL, 1)

	out, err := invoke(t, c, types.InvocationTypeRequestResponse, `"hello"`)
	if err != nil || string(out.Payload) != `"hello"` || out.FunctionError != nil {
		t.Fatalf("sync invoke: %v %+v", err, out)
	}
	out, err = invoke(t, c, types.InvocationTypeRequestResponse, `"fail"`)
	if err != nil || aws.ToString(out.FunctionError) != "Unhandled" {
		t.Fatalf("function error: %v %+v", err, out)
	}
	// A crash takes the environment with it; the next invoke starts another.
	if _, err = invoke(t, c, types.InvocationTypeRequestResponse, `"crash"`); err == nil {
		t.Fatal("a crashed environment's invoke succeeded")
	}
	if out, err = invoke(t, c, types.InvocationTypeRequestResponse, `"again"`); err != nil || string(out.Payload) != `"again"` {
		t.Fatalf("invoke after a crash: %v %+v", err, out)
	}
	if e := launched(); len(e) != 2 || !e[0].stopped.Load() || e[1].stopped.Load() {
		t.Fatalf("environments %d: want the crashed one replaced and stopped, the new one running", len(e))
	}
	// An event is accepted at once and run; a sync invoke while it runs is throttled.
	if out, err = invoke(t, c, types.InvocationTypeEvent, `"queued"`); err != nil || out.StatusCode != 202 {
		t.Fatalf("event: %v %+v", err, out)
	}
	select {
	case <-entered: // the event holds the one environment
	case <-time.After(10 * time.Second):
		t.Fatal("the event did not run")
	}
	if _, err = invoke(t, c, types.InvocationTypeRequestResponse, `"busy"`); err == nil {
		t.Fatal("a sync invoke with the one environment busy was not throttled")
	}
	close(hold)
	testwait.Eventually(t, 10*time.Second, func() bool { return svc.Stats("echo").Async == 1 }, "the event run")
	if st := svc.Stats("echo"); st.Throttled != 1 || st.Environments != 2 {
		t.Fatalf("stats %+v: want 1 throttled, 2 environments", st)
	}
}
