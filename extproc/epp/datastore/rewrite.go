package datastore

// ModelRewrite is one model rewrite rule a pool source provides (an
// InferenceModelRewrite rule in Kubernetes): requests for one of Models
// (any model when empty) go to the targets in proportion to their weights.
type ModelRewrite struct {
	Models  []string
	Targets []RewriteTarget
}

// RewriteTarget is a model to rewrite to and its relative weight.
type RewriteTarget struct {
	Model  string
	Weight int
}
