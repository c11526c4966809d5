package envoy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/gateways/internal/xdsbuild"
)

// File is the gateway description `infergate envoy-bootstrap` reads: the
// fields of Config, with the client certificate as file paths.
type File struct {
	Listen       string       `json:"listen,omitempty"`
	Admin        string       `json:"admin,omitempty"`
	RouteTimeout string       `json:"routeTimeout,omitempty"`
	Payload      *FileServer  `json:"payload,omitempty"`
	Pools        []FilePool   `json:"pools"`
	ClientCert   *FileKeyPair `json:"clientCertificate,omitempty"`
}

// FileServer is a Processor.
type FileServer struct {
	Address   string `json:"address"`
	Plaintext bool   `json:"plaintext,omitempty"`
	FailOpen  bool   `json:"failOpen,omitempty"`
	// HealthCheck is grpc (default) or tcp (a picker without grpc.health.v1).
	HealthCheck string `json:"healthCheck,omitempty"`
}

// FilePool is a Pool; the picker's FailOpen is the pool's failureMode.
type FilePool struct {
	Name         string     `json:"name"`
	Picker       FileServer `json:"picker"`
	Endpoints    []string   `json:"endpoints,omitempty"`
	Models       []string   `json:"models,omitempty"`
	ResponseBody bool       `json:"responseBody,omitempty"`
}

// FileKeyPair names PEM files.
type FileKeyPair struct {
	CertFile string `json:"certFile"`
	KeyFile  string `json:"keyFile"`
}

// LoadConfig reads a gateway description (YAML or JSON), refusing unknown
// fields, with the file named in every error.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	var f File
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	c := Config{Listen: f.Listen, Admin: f.Admin}
	if f.RouteTimeout != "" {
		if c.RouteTimeout, err = time.ParseDuration(f.RouteTimeout); err != nil || c.RouteTimeout <= 0 {
			return Config{}, fmt.Errorf("%s: routeTimeout: %q is not a positive duration", path, f.RouteTimeout)
		}
	}
	if f.Payload != nil {
		c.Payload = &Processor{Address: f.Payload.Address, Plaintext: f.Payload.Plaintext, FailOpen: f.Payload.FailOpen, HealthCheck: f.Payload.HealthCheck}
	}
	for _, p := range f.Pools {
		c.Pools = append(c.Pools, Pool{
			Name: p.Name, Endpoints: p.Endpoints, Models: p.Models, ResponseBody: p.ResponseBody,
			Picker: Processor{Address: p.Picker.Address, Plaintext: p.Picker.Plaintext, FailOpen: p.Picker.FailOpen, HealthCheck: p.Picker.HealthCheck},
		})
	}
	if kp := f.ClientCert; kp != nil {
		chain, err := os.ReadFile(kp.CertFile)
		if err != nil {
			return Config{}, fmt.Errorf("%s: clientCertificate.certFile: %w", path, err)
		}
		key, err := os.ReadFile(kp.KeyFile)
		if err != nil {
			return Config{}, fmt.Errorf("%s: clientCertificate.keyFile: %w", path, err)
		}
		c.ClientCert = &xdsbuild.ClientCert{ChainPEM: chain, KeyPEM: key}
	}
	if _, err := Bootstrap(c); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
