package datastore

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// PoolFile is the standalone stand-in for an InferencePool and the
// InferenceObjectives around it.
type PoolFile struct {
	// Name is informational (logs, metrics).
	Name       string             `json:"name,omitempty"`
	Endpoints  []PoolFileEndpoint `json:"endpoints"`
	Objectives []Objective        `json:"objectives,omitempty"`
}

// PoolFileEndpoint is one endpoint entry of a pool file.
type PoolFileEndpoint struct {
	Address string            `json:"address"`
	Name    string            `json:"name,omitempty"`
	Engine  string            `json:"engine,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// Objective maps an objective name (sent in a request header) to a
// priority; a negative priority marks requests that may be shed.
type Objective struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
}

// LoadPoolFile reads and validates a pool file; errors name the file and
// the field.
func LoadPoolFile(path string) (*PoolFile, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pool file: %w", err)
	}
	pf, err := ParsePoolFile(raw)
	if err != nil {
		return nil, fmt.Errorf("pool file %s: %w", path, err)
	}
	return pf, nil
}

// ParsePoolFile parses pool-file YAML strictly (unknown fields are errors).
func ParsePoolFile(raw []byte) (*PoolFile, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("empty")
	}
	var pf PoolFile
	if err := yaml.UnmarshalStrict(raw, &pf); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, ep := range pf.Endpoints {
		if err := ep.spec().Validate(); err != nil {
			return nil, fmt.Errorf("endpoints[%d]: %w", i, err)
		}
		if seen[ep.Address] {
			return nil, fmt.Errorf("endpoints[%d].address: %s listed twice", i, ep.Address)
		}
		seen[ep.Address] = true
	}
	names := map[string]bool{}
	for i, o := range pf.Objectives {
		if o.Name == "" {
			return nil, fmt.Errorf("objectives[%d].name: required", i)
		}
		if names[o.Name] {
			return nil, fmt.Errorf("objectives[%d].name: %q listed twice", i, o.Name)
		}
		names[o.Name] = true
	}
	return &pf, nil
}

// Specs returns the endpoints as datastore specs.
func (pf *PoolFile) Specs() []Spec {
	out := make([]Spec, 0, len(pf.Endpoints))
	for _, ep := range pf.Endpoints {
		out = append(out, ep.spec())
	}
	return out
}

// Priorities maps objective names to priorities.
func (pf *PoolFile) Priorities() map[string]int {
	out := make(map[string]int, len(pf.Objectives))
	for _, o := range pf.Objectives {
		out[o.Name] = o.Priority
	}
	return out
}

func (ep PoolFileEndpoint) spec() Spec {
	return Spec{Address: ep.Address, Name: ep.Name, Engine: ep.Engine, Labels: ep.Labels}
}
