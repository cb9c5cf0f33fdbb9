package lambdatest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"
	"unicode/utf8"
)

// URLRequest is a Lambda Function URL event (payload format 2.0), the fields Lambda sets.
type URLRequest struct {
	Version         string            `json:"version"`
	RawPath         string            `json:"rawPath"`
	RawQueryString  string            `json:"rawQueryString"`
	Cookies         []string          `json:"cookies,omitempty"`
	Headers         map[string]string `json:"headers"`
	QueryParameters map[string]string `json:"queryStringParameters,omitempty"`
	RequestContext  URLRequestContext `json:"requestContext"`
	Body            string            `json:"body,omitempty"`
	IsBase64Encoded bool              `json:"isBase64Encoded"`
}

// URLRequestContext is the event's requestContext.
type URLRequestContext struct {
	AccountID    string         `json:"accountId"`
	APIID        string         `json:"apiId"`
	DomainName   string         `json:"domainName"`
	DomainPrefix string         `json:"domainPrefix"`
	RequestID    string         `json:"requestId"`
	Time         string         `json:"time"`
	TimeEpoch    int64          `json:"timeEpoch"`
	HTTP         URLRequestHTTP `json:"http"`
}

// URLRequestHTTP is requestContext.http.
type URLRequestHTTP struct {
	Method    string `json:"method"`
	Path      string `json:"path"`
	Protocol  string `json:"protocol"`
	SourceIP  string `json:"sourceIp"`
	UserAgent string `json:"userAgent"`
}

// URLResponse is a BUFFERED Function URL response.
type URLResponse struct {
	StatusCode      int               `json:"statusCode"`
	Headers         map[string]string `json:"headers"`
	Body            string            `json:"body"`
	IsBase64Encoded bool              `json:"isBase64Encoded"`
	Cookies         []string          `json:"cookies"`
}

// EventFromRequest builds the event Lambda would deliver for r arriving at a Function URL
// whose domain is r.Host: header names lowercased and duplicates comma-joined, cookies
// moved to their own field, a non-UTF-8 body base64-encoded.
func EventFromRequest(r *http.Request, body []byte) URLRequest {
	now := time.Now().UTC()
	ev := URLRequest{
		Version:        "2.0",
		RawPath:        r.URL.EscapedPath(),
		RawQueryString: r.URL.RawQuery,
		Headers:        map[string]string{},
		RequestContext: URLRequestContext{
			AccountID: "anonymous", APIID: "lambdatest", DomainName: r.Host,
			DomainPrefix: strings.SplitN(r.Host, ".", 2)[0], RequestID: newID(),
			Time: now.Format("02/Jan/2006:15:04:05 -0700"), TimeEpoch: now.UnixMilli(),
			HTTP: URLRequestHTTP{Method: r.Method, Path: r.URL.EscapedPath(), Protocol: r.Proto,
				SourceIP: hostOnly(r.RemoteAddr), UserAgent: r.UserAgent()},
		},
	}
	for k, vs := range r.Header {
		if strings.EqualFold(k, "Cookie") {
			for _, v := range vs {
				for _, c := range strings.Split(v, ";") {
					ev.Cookies = append(ev.Cookies, strings.TrimSpace(c))
				}
			}
			continue
		}
		ev.Headers[strings.ToLower(k)] = strings.Join(vs, ",")
	}
	ev.Headers["host"] = r.Host
	if len(r.URL.Query()) > 0 {
		ev.QueryParameters = map[string]string{}
		for k, vs := range r.URL.Query() {
			ev.QueryParameters[k] = strings.Join(vs, ",")
		}
	}
	if utf8.Valid(body) {
		ev.Body = string(body)
	} else {
		ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
	}
	return ev
}

// NewFunctionURL serves f as a Function URL would, over TLS on a loopback port: each HTTP
// request becomes a Function URL event with domainName set to the server's host:port, the
// function is invoked under the emulator, and its BUFFERED response is written back. A
// function error or timeout is answered 502, as Lambda does. Clients must trust the
// server's certificate (srv.Client(), or srv.Certificate()).
func NewFunctionURL(f *Function) *httptest.Server {
	return httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read body", http.StatusBadRequest)
			return
		}
		payload, err := json.Marshal(EventFromRequest(r, body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Minute)
		defer cancel()
		resp, err := f.Invoke(ctx, payload)
		if err == nil {
			err = resp.Err()
		}
		if err != nil {
			http.Error(w, fmt.Sprintf(`{"Message":"Internal Server Error: %v"}`, err), http.StatusBadGateway)
			return
		}
		var out URLResponse
		if err := json.Unmarshal(resp.Body, &out); err != nil || out.StatusCode == 0 {
			// Lambda's rule: JSON without statusCode is a 200 with the output as body.
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(resp.Body)
			return
		}
		for k, v := range out.Headers {
			w.Header().Set(k, v)
		}
		for _, c := range out.Cookies {
			w.Header().Add("Set-Cookie", c)
		}
		b := []byte(out.Body)
		if out.IsBase64Encoded {
			if b, err = base64.StdEncoding.DecodeString(out.Body); err != nil {
				http.Error(w, "bad base64 body from function", http.StatusBadGateway)
				return
			}
		}
		w.WriteHeader(out.StatusCode)
		_, _ = w.Write(b)
	}))
}

func hostOnly(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
