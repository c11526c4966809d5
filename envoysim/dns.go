package envoysim

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"
)

// STRICT_DNS as Envoy 1.39 runs it (source/extensions/clusters/dns/
// dns_cluster.cc): every address a name resolves to is a host of its own,
// the name is resolved again every dns_refresh_rate (5 s unset), and a
// change of the addresses updates the cluster's hosts; a lookup that fails
// keeps the hosts it had. New hosts of a health-checked cluster start
// unhealthy until their first check (upstream_impl.cc
// BaseDynamicClusterImpl::updateDynamicHostList, FAILED_ACTIVE_HC).

// defaultDNSRefresh is Cluster.dns_refresh_rate's default.
const defaultDNSRefresh = 5 * time.Second

// dnsSeen records, during one build, what each STRICT_DNS name resolved to
// and how often its clusters want it resolved again.
type dnsSeen struct {
	mu    sync.Mutex
	addrs map[string][]string // by name, sorted
	every time.Duration       // the shortest dns_refresh_rate
}

func newDNSSeen() *dnsSeen { return &dnsSeen{addrs: map[string][]string{}} }

func (d *dnsSeen) record(name string, addrs []string, every time.Duration) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addrs[name] = slices.Sorted(slices.Values(addrs))
	if d.every == 0 || every < d.every {
		d.every = every
	}
}

// snapshot is the names and the refresh interval.
func (d *dnsSeen) snapshot() (map[string][]string, time.Duration) {
	if d == nil {
		return nil, 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.addrs), d.every
}

// refreshDNS resolves the STRICT_DNS names of the clusters in use again
// every dns_refresh_rate and rebuilds when an answer differs from what the
// tables were built with; a failed lookup changes nothing. It ends with ctx.
// A build that records other names or another rate restarts the wait
// (dnsKick).
func (n *Node) refreshDNS(ctx context.Context) {
	for {
		n.mu.Lock()
		_, every := n.dns.snapshot()
		n.mu.Unlock()
		if every <= 0 {
			every = defaultDNSRefresh
		}
		select {
		case <-ctx.Done():
			return
		case <-n.dnsKick:
			continue
		case <-time.After(every):
		}
		n.mu.Lock()
		names, _ := n.dns.snapshot()
		n.mu.Unlock()
		changed := false
		for name, had := range names {
			now, err := n.resolveAll(name)
			if err != nil {
				continue
			}
			if !slices.Equal(slices.Sorted(slices.Values(now)), had) {
				n.log.Info("DNS answer changed", "name", name, "was", had, "now", now)
				changed = true
			}
		}
		if !changed {
			continue
		}
		n.mu.Lock()
		if ctx.Err() == nil {
			if _, err := n.rebuild(n.res, "dns_refresh", ""); err != nil {
				n.log.Error(err, "rebuild after a DNS change")
			}
		}
		n.mu.Unlock()
	}
}

// setDNS makes d the names to refresh, waking the refresher if they or
// their rate changed. Callers hold n.mu.
func (n *Node) setDNS(d *dnsSeen) {
	was, wasEvery := n.dns.snapshot()
	now, every := d.snapshot()
	n.dns = d
	if every != wasEvery || !maps.EqualFunc(was, now, slices.Equal) {
		select {
		case n.dnsKick <- struct{}{}:
		default:
		}
	}
}
