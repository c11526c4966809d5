package policy

import (
	"encoding/json"
	"testing"

	"github.com/infergate/infergate/inference"
)

// FuzzJoinLocate: the second walk finds each text's value in the join
// the first built (by its length and first byte alone) exactly where the
// first put it, whatever the texts hold: escapes, white space at either
// end, empty strings, roles between them, values the per-text pass
// changed.
func FuzzJoinLocate(f *testing.F) {
	for _, s := range []string{"a", " a", "a ", "", "\n", "x\\y", "\u2028", "é", "\t\tb", "4111 1111"} {
		f.Add(s, "b", "c")
	}
	f.Fuzz(func(t *testing.T, a, b, c string) {
		q := func(s string) string {
			out, _ := json.Marshal(s)
			return string(out)
		}
		bodies := []string{
			`{"model":"m","prompt":[` + q(a) + `,` + q(b) + `,"",` + q(c) + `]}`,
			`{"model":"m","system":` + q(a) + `,"messages":[{"role":` + q(b) + `,"content":` + q(c) + `},{"role":"user","content":[{"type":"text","text":` + q(a) + `},{"type":"text","text":` + q(b) + `}]}]}`,
			`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":` + q(`{"k":`+q(a)+`,"n":[1,`+q(b)+`]}`) + `}}]},{"content":` + q(c) + `}]}`,
		}
		for _, body := range bodies {
			bd, err := inference.Parse([]byte(body))
			if err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			for _, changeEvery := range []int{0, 2} {
				w := &walker{body: bd}
				var values []string
				k := 0
				bd.Texts(func(tx inference.Text) bool {
					v := tx.Value()
					if changeEvery > 0 && k%changeEvery == 1 {
						v = " <" + v + ">"
						w.pre = append(w.pre, pre{k, v})
					}
					values = append(values, v)
					k++
					return true
				})
				w.join0 = w.join(false)
				var j joiner
				w.walk(func(w *walker, tx inference.Text, v string, changed bool) {
					if tx.Role() {
						return
					}
					n, first := head(tx, v, changed)
					off := j.locate(w.join0, n, first, tx.Tree())
					if got, want := w.join0[off:off+n], values[w.k]; got != want {
						t.Fatalf("%s: text %d located as %q, want %q in join %q", body, w.k, got, want, w.join0)
					}
				})
				if j.pos != len(w.join0) {
					t.Fatalf("%s: located up to %d of a join of %d bytes", body, j.pos, len(w.join0))
				}
			}
		}
	})
}
