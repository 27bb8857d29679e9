package proxy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/nft"
)

// Syncer turns successive snapshots of one node into its service model and
// NAT table, rebuilding only the Services whose objects changed (as
// kube-proxy's partial syncs do). A Service is unchanged when its Service
// object and EndpointSlice objects are the same pointers as last time:
// informer caches replace an object on every update and never modify it,
// and a snapshot must not be modified once given to Sync. A change in the
// node's own inputs (zone, NodePort addresses, cluster CIDRs) rebuilds
// everything.
//
// The table's shared sets carry revisions and changes (nft.SetChanges), so
// an Applier that applied the previous table sends only what changed. A
// returned table (and model) is valid until the next Sync, which reuses
// its element lists.
type Syncer struct {
	node  string
	opts  Options
	copts CompileOptions
	// last node-level inputs
	zone      string
	npa       []netip.Addr
	cidrs     []netip.Prefix
	tb        *tableBuilder
	services  map[svcKey]*syncedService
	order     []svcKey // the keys of services, sorted
	nodeKnown bool
	bySvc     map[svcKey][]*Slice // reused between syncs
	gen       uint64              // counts syncs
	// parsed are the API slices of Sync's last snapshot, parsed: a
	// slice is parsed again only when its object changes. reparsed
	// (empty) and parsedList are Sync's scratch.
	parsed, reparsed map[*discoveryv1.EndpointSlice]*Slice
	parsedList       []*Slice
	// built and rebuilt hold the contributions of a Service's new and old
	// fragments until tableBuilder.change has them, reused from one
	// Service to the next.
	built, rebuilt []contribution
	// scratch builds one Service at a time, its maps reused.
	scratch builder
}

// syncedService is one Service as last built.
type syncedService struct {
	svc    *corev1.Service
	slices []*Slice // sorted by name
	ports  []*ServicePort
	health []HealthCheck
	errs   []error
	frags  []*fragment
	gen    uint64 // the last sync that saw the Service
}

// NewSyncer returns a Syncer for node.
func NewSyncer(node string, opts Options, copts CompileOptions) *Syncer {
	return &Syncer{node: node, opts: opts, copts: copts}
}

// Sync returns the node's model and table for snap. Ports the compiler
// cannot express are left out and reported in Model.Errors.
func (s *Syncer) Sync(snap *cluster.Snapshot) (*Model, *nft.Table) {
	if snap == nil {
		snap = &cluster.Snapshot{}
	}
	// This sync's parses go to the spare map, which then swaps with
	// the last sync's: neither is made again for each sync.
	if s.reparsed == nil {
		s.reparsed = make(map[*discoveryv1.EndpointSlice]*Slice, len(snap.EndpointSlices))
	}
	list := s.parsedList[:0]
	for _, es := range snap.EndpointSlices {
		if es == nil {
			continue
		}
		ps := s.parsed[es]
		if ps == nil {
			ps = ParseSlice(es, s.node)
		}
		s.reparsed[es] = ps
		list = append(list, ps)
	}
	clear(s.parsed)
	s.parsed, s.reparsed = s.reparsed, s.parsed
	m, t := s.SyncParsed(snap, list)
	clear(list)
	s.parsedList = list[:0]
	return m, t
}

// SyncParsed is Sync with snap's EndpointSlices given parsed (ParseSlice,
// for this Syncer's node), read in place of snap.EndpointSlices. A slice
// is unchanged when it is the same pointer as last time.
func (s *Syncer) SyncParsed(snap *cluster.Snapshot, endpointSlices []*Slice) (*Model, *nft.Table) {
	if snap == nil {
		snap = &cluster.Snapshot{}
	}
	node := &builder{m: &Model{Node: s.node}, node: s.node}
	node.nodeInfo(snap, s.opts)
	m := node.m
	if !s.nodeKnown || m.Zone != s.zone || !slices.Equal(m.NodePortAddresses, s.npa) || !slices.Equal(m.ClusterCIDRs, s.cidrs) {
		s.zone, s.npa, s.cidrs, s.nodeKnown = m.Zone, m.NodePortAddresses, m.ClusterCIDRs, true
		s.tb = newTableBuilder(s.copts)
		// Sized for every Service: grown one at a time, a first sync's
		// map left its earlier tables behind as garbage.
		s.services = make(map[svcKey]*syncedService, len(snap.Services))
		s.order = nil
	}

	if s.bySvc == nil {
		s.bySvc = make(map[svcKey][]*Slice, len(endpointSlices))
	}
	bySvc := s.bySvc
	groupSlices(bySvc, endpointSlices)
	s.gen++
	var added []svcKey
	if len(s.services) == 0 {
		added = make([]svcKey, 0, len(snap.Services))
	}
	for _, svc := range snap.Services {
		if svc == nil {
			continue
		}
		k := svcKey{svc.Namespace, svc.Name}
		esl := bySvc[k]
		old := s.services[k]
		if old != nil && old.svc == svc && slices.Equal(old.slices, esl) {
			old.gen = s.gen
			continue
		}
		fresh := s.build(m, svc, esl)
		fresh.gen = s.gen
		var oldFrags []*fragment
		if old != nil {
			oldFrags = s.contributions(m, old)
		} else {
			added = append(added, k)
		}
		s.tb.change(oldFrags, fresh.frags)
		s.forgetContributions(oldFrags, fresh.frags)
		s.services[k] = fresh
	}
	s.order = insertSorted(s.order, added)
	if len(s.order) != len(snap.Services) { // some Service is gone
		for k, old := range s.services {
			if old.gen != s.gen {
				oldFrags := s.contributions(m, old)
				s.tb.change(oldFrags, nil)
				s.forgetContributions(oldFrags, nil)
				delete(s.services, k)
			}
		}
		s.order = slices.DeleteFunc(s.order, func(k svcKey) bool { return s.services[k] == nil })
	}
	for _, k := range s.order {
		ss := s.services[k]
		m.Services = append(m.Services, ss.ports...)
		m.HealthChecks = append(m.HealthChecks, ss.health...)
		m.Errors = append(m.Errors, ss.errs...)
	}
	return m, s.tb.table(m.ClusterCIDRs, m.ServiceCIDRs)
}

// insertSorted adds keys to the sorted order: one by one when they are
// few (a Service added), else appended and sorted (the first sync: one
// insertion at a time would move the whole order for each of 20,000).
func insertSorted(order, keys []svcKey) []svcKey {
	if len(keys) > 16 {
		order = append(order, keys...)
		slices.SortFunc(order, compareKeys)
		return order
	}
	for _, k := range keys {
		i, _ := slices.BinarySearchFunc(order, k, compareKeys)
		order = slices.Insert(order, i, k)
	}
	return order
}

func compareKeys(a, b svcKey) int {
	return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
}

// A fragment's contributions to the shared sets are in those sets once
// added, so the Syncer does not keep a second copy of them (a third of its
// memory at 20,000 Services): a Service that changes or goes has its
// contributions made again from its ports, as they were made then (the
// node's inputs have not changed, or every Service is rebuilt).

// contributions gives ss's fragments their contributions again, for
// tableBuilder.change to remove. A port that does not compile as it did
// (impossible with the same inputs) is reported in m.Errors and every
// Service is rebuilt at the next Sync.
func (s *Syncer) contributions(m *Model, ss *syncedService) []*fragment {
	for i, fr := range ss.frags {
		again, more, err := compilePort(ss.ports[i], s.npa, s.rebuilt)
		s.rebuilt = more
		if err != nil {
			m.Errors = append(m.Errors, fmt.Errorf("%s/%s port %s compiled before and not now (all Services are rebuilt at the next sync): %w",
				ss.svc.Namespace, ss.svc.Name, ss.ports[i].PortName, err))
			s.nodeKnown = false
			continue
		}
		fr.elems = again.elems
	}
	return ss.frags
}

// forgetContributions drops the fragments' contributions once the shared
// sets have them, and empties the buffers they were in for the next
// Service (cleared: they hold the elements' bytes).
func (s *Syncer) forgetContributions(old, fresh []*fragment) {
	for _, fr := range old {
		fr.elems = nil
	}
	for _, fr := range fresh {
		fr.elems = nil
	}
	clear(s.built)
	clear(s.rebuilt)
	s.built, s.rebuilt = s.built[:0], s.rebuilt[:0]
}

// build builds one Service's ports and fragments with the node's inputs.
func (s *Syncer) build(node *Model, svc *corev1.Service, esl []*Slice) *syncedService {
	b := &s.scratch
	b.node = s.node
	b.m = &Model{Node: node.Node, Zone: node.Zone, NodePortAddresses: node.NodePortAddresses,
		ClusterCIDRs: node.ClusterCIDRs}
	for _, ps := range esl {
		b.m.Errors = append(b.m.Errors, ps.Errors...)
	}
	b.service(svc, esl)
	sortPorts(b.m.Services)
	ss := &syncedService{svc: svc, slices: slices.Clone(esl), health: b.m.HealthChecks, errs: b.m.Errors}
	for _, p := range b.m.Services {
		fr, more, err := compilePort(p, node.NodePortAddresses, s.built)
		s.built = more
		if err != nil {
			ss.errs = append(ss.errs, err)
			continue
		}
		ss.ports = append(ss.ports, p)
		ss.frags = append(ss.frags, fr)
	}
	b.m = nil
	return ss
}
