package datastore

// Objective is an InferenceObjective as a pool source sees it: requests
// that name it (in the objective header) get its priority, and a negative
// priority marks them sheddable.
type Objective struct {
	Name     string
	Priority int
}

// SetObjectives replaces the objectives in effect: a reloaded pool file, a
// change to the InferenceObjectives that name the pool. Of a name listed
// twice the last entry counts.
func (s *Store) SetObjectives(objs []Objective) {
	m := make(map[string]Objective, len(objs))
	for _, o := range objs {
		m[o.Name] = o
	}
	s.objectives.Store(&m)
}

// Objective returns the objective called name, as the reference picker's
// Datastore.ObjectiveGet does; ok is false when there is none, and then
// the zero Objective (priority 0) applies.
func (s *Store) Objective(name string) (Objective, bool) {
	o, ok := (*s.objectives.Load())[name]
	return o, ok
}
