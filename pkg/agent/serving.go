package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	certutil "k8s.io/client-go/util/cert"

	"github.com/netpol/netpol/pkg/compiler"
)

// ServingOptions configure the secure port: HTTPS with delegated
// authentication and authorization, as Kubernetes' own components
// (kube-scheduler, kube-controller-manager) serve metrics and debug
// endpoints. A caller presents a bearer token; the API server says who it
// is (TokenReview) and whether it may get the path (SubjectAccessReview on
// the non-resource URL, e.g. RBAC `nonResourceURLs: ["/metrics",
// "/debug/*"]`). /healthz and /readyz need no authentication.
type ServingOptions struct {
	// SecurePort is the HTTPS port (0: no secure serving).
	SecurePort int
	// BindAddress is the secure port's address (default: every address).
	BindAddress string
	// CertFile and KeyFile are the serving certificate and key (PEM);
	// empty, the agent makes a self-signed one in memory at start.
	CertFile, KeyFile string
	// MaxWatchers bounds the concurrent /debug/model watch streams of all
	// listeners together (default DefaultMaxWatchers).
	MaxWatchers int
	// AuthCacheTTL is how long an authentication or authorization answer
	// is cached (default 10s).
	AuthCacheTTL time.Duration
}

func (s ServingOptions) maxWatchers() int {
	if s.MaxWatchers <= 0 {
		return DefaultMaxWatchers
	}
	return s.MaxWatchers
}

// alwaysAllowed paths need no authentication on the secure port.
var alwaysAllowed = map[string]bool{"/healthz": true, "/readyz": true}

// secureHandler builds the secure port's handler (authentication, then
// authorization, then the metrics, debug and health handlers) and its TLS
// configuration.
func (a *Agent) secureHandler() (http.Handler, *tls.Config, error) {
	if a.kube == nil {
		return nil, nil, errors.New("secure serving needs an API client")
	}
	ttl := a.opts.Serving.AuthCacheTTL
	if ttl == 0 {
		ttl = 10 * time.Second
	}
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  a.kube.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff,
		CacheTTL:                 ttl,
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("delegated authentication: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: a.kube.AuthorizationV1(),
		AllowCacheTTL:             ttl,
		DenyCacheTTL:              ttl,
		WebhookRetryBackoff:       backoff,
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("delegated authorization: %w", err)
	}
	cert, err := a.servingCertificate()
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	health := a.healthMux()
	mux.Handle("/healthz", health)
	mux.Handle("/readyz", health)
	mux.Handle("/metrics", a.metricsMux())
	mux.Handle("/debug/", a.debugMux())
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	return withAuth(mux, authn, authz, a.log.Warn), tlsConfig, nil
}

// withAuth authenticates and authorizes every request but the always
// allowed paths: 401 without a valid token, 403 when the API server's
// authorizer does not allow the user to get the path.
func withAuth(h http.Handler, authn authenticator.Request, authz authorizer.UnconditionalAuthorizer, warn func(string, ...any)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if alwaysAllowed[r.URL.Path] {
			h.ServeHTTP(w, r)
			return
		}
		res, ok, err := authn.AuthenticateRequest(r)
		if err != nil || !ok {
			if err != nil {
				warn("authentication failed", "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="netpol-agent"`)
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		// The request's token is not handed to anything behind this point.
		r.Header.Del("Authorization")
		attrs := authorizer.AttributesRecord{User: res.User, Verb: "get", Path: r.URL.Path, ResourceRequest: false}
		decision, reason, err := authz.Authorize(r.Context(), attrs)
		if decision != authorizer.DecisionAllow {
			if err != nil {
				warn("authorization failed", "path", r.URL.Path, "user", res.User.GetName(), "err", err)
			}
			msg := fmt.Sprintf("forbidden: user %q may not get path %q", res.User.GetName(), r.URL.Path)
			if reason != "" {
				msg += ": " + reason
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// servingCertificate loads CertFile and KeyFile, or makes a self-signed
// certificate for the node name, localhost and the bind address.
func (a *Agent) servingCertificate() (tls.Certificate, error) {
	s := a.opts.Serving
	if s.CertFile != "" || s.KeyFile != "" {
		if s.CertFile == "" || s.KeyFile == "" {
			return tls.Certificate{}, errors.New("--tls-cert-file and --tls-private-key-file go together")
		}
		cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
		}
		return cert, nil
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	if ip := net.ParseIP(s.BindAddress); ip != nil && !ip.IsUnspecified() {
		ips = append(ips, ip)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(a.opts.NodeName, ips, []string{"localhost"})
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed serving certificate: %w", err)
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// agentPorts is the protection of the agent's own ports that the policy
// table carries (ProtectAgentPorts): the metrics, debug and secure ports,
// whichever are on; the health port stays open (the kubelet probes it).
func (o Options) agentPorts() *compiler.AgentPorts {
	if !o.ProtectAgentPorts {
		return nil
	}
	p := &compiler.AgentPorts{Allowed: o.AgentPortsAllow}
	for _, addr := range []string{o.MetricsAddr, o.DebugAddr} {
		if port := listenPort(addr); port != 0 && !loopbackOnly(addr) {
			p.Ports = append(p.Ports, port)
		}
	}
	if o.Serving.SecurePort > 0 && !loopbackOnly(o.Serving.BindAddress) {
		p.Ports = append(p.Ports, uint16(o.Serving.SecurePort))
	}
	if len(p.Ports) == 0 {
		return nil
	}
	return p
}

func listenPort(addr string) uint16 {
	if addr == "" {
		return 0
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(port, 10, 16)
	return uint16(n)
}

// loopbackOnly says an address (host:port or host) listens on loopback
// only: nothing from outside the node reaches it, nothing to protect.
func loopbackOnly(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
