package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
)

// Cookie and form field names.
const (
	sessionCookie = "outbox_ui_session"
	csrfCookie    = "outbox_ui_csrf"
	csrfField     = "csrf_token"
	csrfHeader    = "X-CSRF-Token"
)

// mac returns HMAC-SHA256 of parts under the process key, base64url.
func (s *Server) mac(parts ...string) string {
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// tokenOK compares a presented token with the configured one in constant time (hashing
// both first, so the comparison does not reveal the token's length either).
func (s *Server) tokenOK(presented string) bool {
	a, b := sha256.Sum256([]byte(presented)), sha256.Sum256([]byte(s.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// sessionValue is the login cookie's value: a MAC of the token under the process key, so
// the cookie does not carry the token and dies with the process.
func (s *Server) sessionValue() string { return s.mac("session", s.cfg.Token) }

// authenticated reports whether r carries the token (header or login cookie); always true
// without a token.
func (s *Server) authenticated(r *http.Request) bool {
	if s.cfg.Token == "" {
		return true
	}
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		return ok && strings.EqualFold(scheme, "Bearer") && s.tokenOK(strings.TrimSpace(tok))
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		return equal(c.Value, s.sessionValue())
	}
	return false
}

// authed answers 401 (with the login form for a browser) unless the request is authenticated.
func (s *Server) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.authenticated(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outbox console"`)
			s.renderLogin(w, r, http.StatusUnauthorized, "")
			return
		}
		next(w, r)
	}
}

// csrf returns the CSRF token for r's browser, setting the CSRF cookie first when r has
// none (or one this process did not issue). The cookie holds a random nonce and its MAC;
// the token is another MAC of the nonce. A forged request from another site cannot read
// the token, and a cookie planted by a sibling host cannot produce a valid one.
func (s *Server) csrf(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil {
		if nonce, ok := s.csrfNonce(c.Value); ok {
			return s.mac("csrf-form", nonce)
		}
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic("console: read random: " + err.Error()) // crypto/rand does not fail on Linux
	}
	nonce := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie, Value: nonce + "." + s.mac("csrf-cookie", nonce), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	return s.mac("csrf-form", nonce)
}

func (s *Server) csrfNonce(cookie string) (string, bool) {
	nonce, sum, ok := strings.Cut(cookie, ".")
	if !ok || nonce == "" || !equal(sum, s.mac("csrf-cookie", nonce)) {
		return "", false
	}
	return nonce, true
}

// csrfOK checks the request's token (form field or header) against its CSRF cookie.
func (s *Server) csrfOK(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil {
		return false
	}
	nonce, ok := s.csrfNonce(c.Value)
	if !ok {
		return false
	}
	tok := r.PostFormValue(csrfField)
	if tok == "" {
		tok = r.Header.Get(csrfHeader)
	}
	return tok != "" && equal(tok, s.mac("csrf-form", nonce))
}

// sameOrigin rejects a request whose Origin (sent by browsers on every POST) names
// another host; a request without Origin (curl) relies on the CSRF token alone.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// action guards a state-changing handler: redrive must be allowed, the origin must be
// ours and the CSRF token must match. Responses are never stored.
func (s *Server) action(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if !s.cfg.AllowRedrive {
			http.Error(w, "this console is read-only; restart outboxctl ui with --allow-redrive to redrive", http.StatusForbidden)
			return
		}
		if !sameOrigin(r) || !s.csrfOK(r) {
			http.Error(w, "missing or invalid CSRF token: reload the page and try again", http.StatusForbidden)
			return
		}
		next(w, r)
	}
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == "" || s.authenticated(r) {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.renderLogin(w, r, http.StatusOK, "")
}

// login checks the token from the form and sets the session cookie.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !sameOrigin(r) || !s.csrfOK(r) {
		http.Error(w, "missing or invalid CSRF token: reload the page and try again", http.StatusForbidden)
		return
	}
	if s.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	if !s.tokenOK(r.PostFormValue("token")) {
		s.cfg.Logger.Warn("console login refused", "remote_addr", r.RemoteAddr)
		s.renderLogin(w, r, http.StatusUnauthorized, "That token is not the console's token.")
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: s.sessionValue(), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	s.cfg.Logger.Info("console login", "remote_addr", r.RemoteAddr)
	http.Redirect(w, r, localPath(r.PostFormValue("next")), http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if !sameOrigin(r) || !s.csrfOK(r) {
		http.Error(w, "missing or invalid CSRF token: reload the page and try again", http.StatusForbidden)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// localPath keeps a redirect target on this console: a path, never a URL elsewhere.
func localPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") {
		return "/"
	}
	return p
}
