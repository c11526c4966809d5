package scheduling

// setRand replaces a picker's randomness with a seeded source.
func setRand(p Picker, r rng) {
	switch p := p.(type) {
	case *maxScorePicker:
		p.rnd = r
	case *randomPicker:
		p.rnd = r
	case *weightedRandomPicker:
		p.rnd = r
	}
}
