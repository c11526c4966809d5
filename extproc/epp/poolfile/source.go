// Package poolfile feeds the endpoint picker's datastore from a pool file,
// the standalone stand-in for an InferencePool and its
// InferenceObjectives: the endpoints and the objectives go into the store,
// and again whenever the file changes. It is the Kubernetes source's
// sibling (package kube); the picker reads the store either way.
package poolfile

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/internal/filewatch"
)

// Options say which file to follow and where the result goes.
type Options struct {
	Path string
	// EngineLabel is the endpoint label naming the model-server engine of
	// an entry that names none.
	EngineLabel string
	// Poll is how often the file is checked for changes; 0 means a second.
	Poll   time.Duration
	Store  *datastore.Store
	Logger logr.Logger
}

// Source is a pool file loaded into its store, ready to follow changes.
type Source struct {
	opts  Options
	stamp filewatch.Stamp
}

// Open loads the file into the store. A file that cannot be used is an
// error naming the file and the field: the picker does not start on it.
func Open(o Options) (*Source, error) {
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	s := &Source{opts: o}
	if _, err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// Run reloads the file whenever it changes until ctx ends. A broken edit
// is logged and the previous pool kept.
func (s *Source) Run(ctx context.Context) {
	filewatch.Watch(ctx, s.opts.Path, s.stamp, s.opts.Poll, s.reload)
}

func (s *Source) load() (*file, error) {
	stamp, err := filewatch.StampOf(s.opts.Path)
	if err != nil {
		return nil, fmt.Errorf("pool file: %w", err)
	}
	f, err := read(s.opts.Path)
	if err != nil {
		return nil, err
	}
	if err := s.opts.Store.Replace(f.specs(s.opts.EngineLabel)); err != nil {
		return nil, fmt.Errorf("pool file %s: %w", s.opts.Path, err)
	}
	s.opts.Store.SetObjectives(f.objectives())
	s.stamp = stamp
	return f, nil
}

func (s *Source) reload() {
	f, err := s.load()
	if err != nil {
		s.opts.Logger.Error(err, "pool file changed but cannot be used; keeping the previous endpoints")
		return
	}
	s.opts.Logger.Info("pool file reloaded", "endpoints", len(f.Endpoints))
}
