package poolfile

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// file is the pool file's shape: the standalone stand-in for an
// InferencePool and the InferenceObjectives around it.
type file struct {
	// Name is informational.
	Name       string      `json:"name,omitempty"`
	Endpoints  []endpoint  `json:"endpoints"`
	Objectives []objective `json:"objectives,omitempty"`
}

// endpoint is one endpoint entry of a pool file.
type endpoint struct {
	Address string            `json:"address"`
	Name    string            `json:"name,omitempty"`
	Engine  string            `json:"engine,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// objective maps an objective name (sent in a request header) to a
// priority; a negative priority marks requests that may be shed.
type objective struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
}

// read reads and validates a pool file; errors name the file and the
// field.
func read(path string) (*file, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pool file: %w", err)
	}
	f, err := parse(raw)
	if err != nil {
		return nil, fmt.Errorf("pool file %s: %w", path, err)
	}
	return f, nil
}

// parse parses pool-file YAML strictly (unknown fields are errors).
func parse(raw []byte) (*file, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("empty")
	}
	var f file
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, ep := range f.Endpoints {
		if err := ep.spec().Validate(); err != nil {
			return nil, fmt.Errorf("endpoints[%d]: %w", i, err)
		}
		if seen[ep.Address] {
			return nil, fmt.Errorf("endpoints[%d].address: %s listed twice", i, ep.Address)
		}
		seen[ep.Address] = true
	}
	names := map[string]bool{}
	for i, o := range f.Objectives {
		if o.Name == "" {
			return nil, fmt.Errorf("objectives[%d].name: required", i)
		}
		if names[o.Name] {
			return nil, fmt.Errorf("objectives[%d].name: %q listed twice", i, o.Name)
		}
		names[o.Name] = true
	}
	return &f, nil
}

// specs returns the endpoints as datastore specs, the engine read from
// the label engineLabel where an entry names none.
func (f *file) specs(engineLabel string) []datastore.Spec {
	out := make([]datastore.Spec, 0, len(f.Endpoints))
	for _, ep := range f.Endpoints {
		out = append(out, ep.spec().EngineFromLabel(engineLabel))
	}
	return out
}

// objectives returns the objectives as the datastore holds them.
func (f *file) objectives() []datastore.Objective {
	out := make([]datastore.Objective, 0, len(f.Objectives))
	for _, o := range f.Objectives {
		out = append(out, datastore.Objective{Name: o.Name, Priority: o.Priority})
	}
	return out
}

func (ep endpoint) spec() datastore.Spec {
	return datastore.Spec{Address: ep.Address, Name: ep.Name, Engine: ep.Engine, Labels: ep.Labels}
}
