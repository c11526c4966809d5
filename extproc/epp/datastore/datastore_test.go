package datastore

import (
	"testing"
	"time"
)

func TestReplaceKeepsMetricsOfUnchangedEndpoints(t *testing.T) {
	s := New()
	if s.Synced() {
		t.Fatal("new store is synced")
	}
	if err := s.Replace([]Spec{{Address: "10.0.0.1:8000"}, {Address: "10.0.0.2:8000"}}); err != nil {
		t.Fatal(err)
	}
	s.Get("10.0.0.1:8000").SetMetrics(&Metrics{WaitingQueueSize: 3, UpdatedAt: time.Now()})
	sg := Spec{Address: "10.0.0.3:8000", Labels: map[string]string{EngineLabel: "sglang"}}.EngineFromLabel(EngineLabel)
	if err := s.Replace([]Spec{{Address: "10.0.0.1:8000"}, sg}); err != nil {
		t.Fatal(err)
	}
	eps := s.Endpoints()
	if len(eps) != 2 || eps[0].Address != "10.0.0.1:8000" || eps[1].Address != "10.0.0.3:8000" {
		t.Fatalf("endpoints %v", eps)
	}
	if m := eps[0].Metrics(); m == nil || m.WaitingQueueSize != 3 {
		t.Error("metrics of an unchanged endpoint were lost")
	}
	if eps[1].Engine != EngineSGLang || eps[0].Engine != EngineVLLM {
		t.Errorf("engines %q %q", eps[0].Engine, eps[1].Engine)
	}
	if s.Get("10.0.0.2:8000") != nil {
		t.Error("removed endpoint still present")
	}
}

func TestFreshMetrics(t *testing.T) {
	e := &Endpoint{}
	now := time.Now()
	if e.FreshMetrics(now, time.Second) != nil {
		t.Fatal("never-scraped endpoint has metrics")
	}
	e.SetMetrics(&Metrics{UpdatedAt: now.Add(-500 * time.Millisecond)})
	if e.FreshMetrics(now, time.Second) == nil {
		t.Fatal("fresh metrics reported stale")
	}
	if e.FreshMetrics(now, 100*time.Millisecond) != nil {
		t.Fatal("stale metrics reported fresh")
	}
	e.SetScrapeError("boom")
	if e.ScrapeError() != "boom" || e.Metrics() == nil {
		t.Fatal("a failed scrape must keep the last metrics and record the error")
	}
}
