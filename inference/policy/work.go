package policy

// WorkBytes bounds the memory Apply allocates, beyond the body itself, to
// decide a body of n bytes: the parse, the join of the texts and its
// folded readings, the findings and the masked copies, the rewritten
// body. A server charges it to its buffer budget while the decision
// runs, since a body's bytes alone undercount what deciding it holds.
// It bounds what is allocated in all, so it also bounds what is held at
// once (TestWorkBytesBoundsApply measures it on the costliest shapes).
func (p *Policy) WorkBytes(n int) int64 {
	if !p.readsText() || len(p.deny) == 0 && len(p.pii) == 0 {
		return int64(n) // the index of the parse and a rewritten body at most
	}
	// A finding is at least minFindingBytes long ("a@b.cd", "1.2.3.4"),
	// and at most maxFindings are kept before the request is refused.
	findings := min(int64(p.maxFindings), int64(n)/minFindingBytes)
	return workFactor*int64(n) + findingBytes*findings
}

const (
	// workFactor is what a decision allocates per body byte on text that
	// costs most to read: the join, its fold and spaced fold, the deny
	// rules' readings (5.5 per byte measured on text dense in zero-width
	// characters).
	workFactor = 6
	// findingBytes is what one finding costs to mask: its records in
	// each reading, its edit and the rewritten strings (about 850 bytes
	// measured for e-mail addresses that are each a string of encoded
	// tool-call arguments, the costliest).
	findingBytes    = 1 << 10
	minFindingBytes = 6
)
