package scheduling

import (
	"context"
	"fmt"
)

// SingleProfileHandlerType is the profile handler of a config with one
// profile; the config adds one when it declares none.
const SingleProfileHandlerType = "single-profile-handler"

// singleProfileHandler runs the one configured profile once.
type singleProfileHandler struct{ named }

func (singleProfileHandler) Profiles(_ context.Context, _ *Request, all map[string]*Profile, done map[string]*ProfileResult) []*Profile {
	if len(done) > 0 {
		return nil
	}
	for _, p := range all {
		return []*Profile{p}
	}
	return nil
}

func (singleProfileHandler) Primary(done map[string]*ProfileResult) (string, error) {
	for name := range done {
		return name, nil
	}
	return "", fmt.Errorf("%s: %w", SingleProfileHandlerType, ErrNoCandidates)
}
