package sim

import (
	"encoding/json"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/infergate/infergate/inference/wire"
)

// Echo makes the server the model server the upstream InferencePool
// conformance suite expects: Gateway API's echo-basic. Every request that is
// not /health or /status/NNN is answered 200 with a JSON description of
// itself (path, host, method, protocol, headers, port, and the pod it
// reached), and X-Echo-Set-Header "name:value[,name:value]" sets those
// response headers, which is how the suite's endpoint picker has the served
// endpoint reported back. Field names, casing and the header's comma rules
// follow echo-basic, so the suite's assertions read it unchanged.
type Echo struct {
	// Namespace and Pod are reported as the request's destination (the
	// suite checks the pod name's prefix and the namespace); Pod defaults
	// to the server's Name.
	Namespace, Pod string
	// Ingress and Service are reported as echo-basic reports its
	// INGRESS_NAME and SERVICE_NAME.
	Ingress, Service string
}

// echoReply is echo-basic's RequestAssertions without TLS (the sim serves
// plaintext).
type echoReply struct {
	Path     string              `json:"path"`
	Host     string              `json:"host"`
	Method   string              `json:"method"`
	Proto    string              `json:"proto"`
	Headers  map[string][]string `json:"headers"`
	HTTPPort string              `json:"httpPort"`

	Namespace string `json:"namespace"`
	Ingress   string `json:"ingress"`
	Service   string `json:"service"`
	Pod       string `json:"pod"`
}

var statusPath = regexp.MustCompile(`^/status/(\d\d\d)$`)

// echoRoutes serves the echo contract in place of the inference API.
func (s *Server) echoRoutes() http.Handler {
	e := *s.cfg.Echo
	if e.Pod == "" {
		e.Pod = s.cfg.Name
	}
	return s.withIdentity(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// echo-basic collapses doubled slashes before routing.
		path := strings.ReplaceAll(r.URL.Path, "//", "/")
		switch {
		case path == "/health":
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("OK"))
			return
		case strings.HasPrefix(path, "/status/"):
			code := http.StatusBadRequest
			if m := statusPath.FindStringSubmatch(r.RequestURI); m != nil {
				code, _ = strconv.Atoi(m[1])
			}
			w.WriteHeader(code)
			return
		}
		port := ""
		if addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			_, port, _ = net.SplitHostPort(addr.String())
		}
		js, err := json.MarshalIndent(echoReply{
			Path: r.RequestURI, Host: r.Host, Method: r.Method, Proto: r.Proto, Headers: r.Header, HTTPPort: port,
			Namespace: e.Namespace, Ingress: e.Ingress, Service: e.Service, Pod: e.Pod,
		}, "", " ")
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		setEchoHeaders(w, r.Header.Values(wire.EchoSetHeader))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(js)
	}))
}

// setEchoHeaders applies X-Echo-Set-Header values: comma-separated
// name:value pairs; a name set twice gets the values joined by commas; the
// name's casing is kept as given.
func setEchoHeaders(w http.ResponseWriter, values []string) {
	for _, list := range values {
		for _, kv := range strings.Split(list, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(kv), ":")
			if len(w.Header()[name]) == 0 {
				w.Header()[name] = []string{value}
			} else {
				w.Header()[name][0] += "," + strings.TrimSpace(value)
			}
		}
	}
}
