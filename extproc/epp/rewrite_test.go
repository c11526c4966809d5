package epp

import "testing"

func TestRewriteModel(t *testing.T) {
	got, err := rewriteModel([]byte(`{"prompt":"x","mod\u0065l" : "a","stream":true}`), `b"c`)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != `{"prompt":"x","mod\u0065l" : "b\"c","stream":true}` {
		t.Errorf("got %s", got)
	}
	if _, err := rewriteModel([]byte(`{"prompt":"x"}`), "b"); err == nil {
		t.Error("a body without a model was rewritten")
	}
}
