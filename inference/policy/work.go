package policy

// WorkBytes bounds the memory Apply allocates, beyond the body itself, to
// decide a body of n bytes: the parse, the join of the texts and its
// folded readings, the findings and the masked copies, the rewritten
// body. A server charges it to its buffer budget while the decision
// runs, since a body's bytes alone undercount what deciding it holds.
func (p *Policy) WorkBytes(n int) int64 {
	if !p.readsText() || len(p.deny) == 0 && len(p.pii) == 0 {
		return int64(n) // the index of the parse and a rewritten body at most
	}
	return workFactor * int64(n)
}

// workFactor is the peak a guardrail decision holds per body byte, as
// measured on the costliest bodies (see BenchmarkWorkBytes).
const workFactor = 6
