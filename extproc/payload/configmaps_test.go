package payload

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/infergate/infergate/inference/policy"
)

func cm(name, base, adapters string) corev1.ConfigMap {
	return corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Data: map[string]string{BaseModelKey: base, AdaptersKey: adapters}}
}

func TestBasesFromConfigMaps(t *testing.T) {
	bases, problems := basesFromConfigMaps([]corev1.ConfigMap{
		cm("a", "llama", "- sql-lora\n- food-review\n"),
		cm("b", "llama", "[sql-lora, tweet-lora]"), // same base again: adapters add up
		cm("c", "qwen", ""),
		cm("no-base", "", "- x"),
		cm("bad-list", "mistral", "sql: lora"),
	})
	if got := fmt.Sprint(bases); got != "[{llama [food-review sql-lora tweet-lora]} {qwen []}]" {
		t.Errorf("bases %s", got)
	}
	if len(problems) != 2 || !strings.Contains(problems[0].Error(), `ns/no-base: no "baseModel"`) || !strings.Contains(problems[1].Error(), "ns/bad-list") {
		t.Errorf("problems %v", problems)
	}
}

func TestMergeBases(t *testing.T) {
	file := []policy.BaseModel{{Name: "llama", Adapters: []string{"sql-lora"}}}
	cluster := []policy.BaseModel{{Name: "llama", Adapters: []string{"sql-lora", "tweet-lora"}}, {Name: "qwen", Adapters: []string{"x"}}}
	got := mergeBases(file, cluster)
	if fmt.Sprint(got) != "[{llama [sql-lora tweet-lora]} {qwen [x]}]" {
		t.Errorf("merged %v", got)
	}
	// A conflict stays visible for Compile to report.
	conflict := mergeBases(file, []policy.BaseModel{{Name: "qwen", Adapters: []string{"sql-lora"}}})
	if _, err := policy.Compile(&policy.Config{Models: policy.Models{Bases: conflict}}); err == nil || !strings.Contains(err.Error(), `"sql-lora" already maps to "llama"`) {
		t.Errorf("conflict not reported: %v", err)
	}
}
