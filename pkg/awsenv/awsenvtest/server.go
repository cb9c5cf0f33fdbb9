// Package awsenvtest is a local stand-in for the two AWS APIs awsenv reads, in the style of
// net/http/httptest: the Secrets Manager GetSecretValue and SSM GetParameters operations
// over their real wire format (POST /, application/x-amz-json-1.1, X-Amz-Target), so the
// real aws-sdk-go-v2 clients can be pointed at it with BaseEndpoint or AWS_ENDPOINT_URL.
// Request signatures are required to be present but not checked.
package awsenvtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
)

// Operations served, as their X-Amz-Target values.
const (
	TargetGetSecretValue = "secretsmanager.GetSecretValue"
	TargetGetParameters  = "AmazonSSM.GetParameters"
)

// Server is a running stub.
type Server struct {
	// URL is the endpoint, e.g. http://127.0.0.1:40123 (AWS_ENDPOINT_URL).
	URL string

	srv      *httptest.Server
	mu       sync.Mutex
	secrets  map[string]string
	params   map[string]string
	requests map[string]int
}

// NewServer starts a stub on a loopback port. Call Close when done.
func NewServer() *Server {
	s := &Server{secrets: map[string]string{}, params: map[string]string{}, requests: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// Close shuts the stub down.
func (s *Server) Close() { s.srv.Close() }

// PutSecret stores a secret string under id (an ARN or a name).
func (s *Server) PutSecret(id, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secrets[id] = value
}

// PutParameter stores a SecureString parameter.
func (s *Server) PutParameter(name, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.params[name] = value
}

// Requests returns how many requests target received.
func (s *Server) Requests(target string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[target]
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	target := r.Header.Get("X-Amz-Target")
	s.mu.Lock()
	s.requests[target]++
	s.mu.Unlock()
	switch {
	case r.Method != http.MethodPost || r.URL.Path != "/":
		awsError(w, http.StatusNotFound, "UnknownOperationException", "POST / only")
		return
	case !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 "):
		awsError(w, http.StatusBadRequest, "MissingAuthenticationTokenException", "request is not signed")
		return
	}
	switch target {
	case TargetGetSecretValue:
		s.getSecretValue(w, r)
	case TargetGetParameters:
		s.getParameters(w, r)
	default:
		awsError(w, http.StatusBadRequest, "UnknownOperationException", fmt.Sprintf("operation %q not served", target))
	}
}

func (s *Server) getSecretValue(w http.ResponseWriter, r *http.Request) {
	var in struct{ SecretId string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.SecretId == "" {
		awsError(w, http.StatusBadRequest, "InvalidParameterException", "SecretId is required")
		return
	}
	s.mu.Lock()
	v, ok := s.secrets[in.SecretId]
	s.mu.Unlock()
	if !ok {
		awsError(w, http.StatusBadRequest, "ResourceNotFoundException", "Secrets Manager can't find the specified secret.")
		return
	}
	reply(w, map[string]any{
		"ARN": in.SecretId, "Name": in.SecretId, "SecretString": v,
		"VersionId": "00000000-0000-0000-0000-000000000001", "VersionStages": []string{"AWSCURRENT"},
	})
}

func (s *Server) getParameters(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Names          []string
		WithDecryption bool
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || len(in.Names) == 0 || len(in.Names) > 10 {
		awsError(w, http.StatusBadRequest, "ValidationException", "Names must hold 1 to 10 names")
		return
	}
	params := []map[string]any{}
	invalid := []string{}
	s.mu.Lock()
	for _, n := range in.Names {
		v, ok := s.params[n]
		if !ok {
			invalid = append(invalid, n)
			continue
		}
		if !in.WithDecryption {
			v = "encrypted:" + v // what a SecureString looks like undecrypted: not the value
		}
		params = append(params, map[string]any{"Name": n, "Type": "SecureString", "Value": v, "Version": 1})
	}
	s.mu.Unlock()
	reply(w, map[string]any{"Parameters": params, "InvalidParameters": invalid})
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	_ = json.NewEncoder(w).Encode(v)
}

func awsError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "message": msg})
}
