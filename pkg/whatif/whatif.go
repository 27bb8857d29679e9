// Package whatif says what a change to the cluster would do to policy:
// the cells of the truth table (source pod, destination pod, port) whose
// verdict differs between two states, each with the decisions explain
// gives before and after (`netpol diff`).
//
// When the two states have the same pods, namespaces and nodes (a change
// of policies only, the usual question), only the cells a changed policy
// can touch are evaluated again: a cell's verdict is its source's egress
// and its destination's ingress, each decided by the policies that select
// that pod; a cell none of whose sides is selected by a policy that was
// added, deleted or changed (before or after) keeps its verdict. Otherwise
// every cell is evaluated in both states.
package whatif

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// State is one side of the comparison: a snapshot and its evaluator.
type State struct {
	Snapshot  *cluster.Snapshot
	Evaluator *eval.Evaluator
}

// NewState builds the evaluator of snap (policy.Build, eval.New).
func NewState(snap *cluster.Snapshot) State {
	return State{Snapshot: snap, Evaluator: eval.New(snap, policy.Build(snap))}
}

// Change is one cell whose verdict the change flips.
type Change struct {
	From     string          `json:"from"`
	To       string          `json:"to"`
	Protocol corev1.Protocol `json:"protocol"`
	Port     int32           `json:"port"`
	Before   bool            `json:"before"`
	After    bool            `json:"after"`
	// Direction is the side that flipped: egress (the source's; also when
	// both did) or ingress (the destination's).
	Direction string `json:"direction"`
	// BeforeDecision and AfterDecision are explain's decision of that
	// side, in each state.
	BeforeDecision *eval.DirectionVerdict `json:"beforeDecision"`
	AfterDecision  *eval.DirectionVerdict `json:"afterDecision"`
}

// Result is what a change does.
type Result struct {
	Changes []Change `json:"changes"`
	// CellsCompared are the cells of pods in both states; Unchanged those
	// of them that keep their verdict.
	CellsCompared int `json:"cellsCompared"`
	Unchanged     int `json:"unchanged"`
	// OnlyBefore and OnlyAfter are the pods of one state only: their
	// cells are not compared.
	OnlyBefore []string `json:"onlyBefore,omitempty"`
	OnlyAfter  []string `json:"onlyAfter,omitempty"`
	// Ports are the probes compared.
	Ports []string `json:"ports"`
	// Evaluated counts the cells evaluated in both states (the others
	// could not change). ChangedPolicies are the policies added, deleted
	// or changed; PodsChanged says pods, namespaces or nodes differ too,
	// so that every cell was evaluated.
	Evaluated       int      `json:"evaluated"`
	ChangedPolicies []string `json:"changedPolicies"`
	PodsChanged     bool     `json:"podsChanged"`
}

// Options choose the table compared (its pods, ports and family; the
// ports both states' pods declare when it has none) and how much of each
// decision a change carries.
type Options struct {
	eval.TruthTableOptions
	// Explain gives each change explain's whole decision of the side that
	// flipped (also the rules that did not decide, and the policies that
	// do not select the subject: what `netpol diff -o json` prints);
	// without it, what decided (eval.Evaluator.Decide).
	Explain bool
}

// Compare is what changes between before and after in the table opts
// chooses.
func Compare(before, after State, o Options) *Result {
	opts := o.TruthTableOptions
	res := &Result{ChangedPolicies: []string{}}
	if len(opts.Probes) == 0 {
		opts.Probes = unionProbes(before.Evaluator.DeclaredProbes(opts), after.Evaluator.DeclaredProbes(opts))
	}
	for _, p := range opts.Probes {
		res.Ports = append(res.Ports, p.String())
	}
	changed := changedPolicies(before.Snapshot, after.Snapshot)
	for ref := range changed {
		res.ChangedPolicies = append(res.ChangedPolicies, ref)
	}
	slices.Sort(res.ChangedPolicies)
	res.PodsChanged = !sameWorkloads(before.Snapshot, after.Snapshot)

	rb, ra := before.Evaluator.Resolved(), after.Evaluator.Resolved()
	// touched[d][i]: after's pod i may decide otherwise in direction d.
	var touched [2][]bool
	if !res.PodsChanged {
		touched = touchedPods(rb, ra, changed)
	}
	eb, ea := before.Evaluator, after.Evaluator
	// before's endpoint of each of after's pods, per family (ok false:
	// the pod is not there, or has no such address).
	type beforeEndpoint struct {
		ep eval.Endpoint
		ok bool
	}
	inBefore := make([][2]beforeEndpoint, ra.NumPods())
	for i := range ra.NumPods() {
		for f, fam := range []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6} {
			ep, err := eb.Endpoint(ra.Pod(i).Key, fam, netip.Addr{})
			inBefore[i][f] = beforeEndpoint{ep, err == nil}
		}
	}
	epBefore := func(ep eval.Endpoint) (eval.Endpoint, bool) {
		f := 0
		if ep.Addr.Is6() {
			f = 1
		}
		b := inBefore[ep.Pod][f]
		return b.ep, b.ok
	}
	var mu sync.Mutex // changes
	type indexed struct {
		Change
		index int
	}
	var changes []indexed
	var evaluated atomic.Int64
	table := &eval.TruthTable{}
	ea.TableCells(opts, table).Run(func(cell eval.Cell) {
		src, dst, probe := cell.Src, cell.Dst, cell.Probe
		// A side no changed policy selects decides alike in both states.
		egressTouched := res.PodsChanged || touched[policy.Egress][src.Pod]
		ingressTouched := res.PodsChanged || touched[policy.Ingress][dst.Pod]
		if !cell.OK || !egressTouched && !ingressTouched {
			return // it keeps its verdict
		}
		srcB, okS := epBefore(src)
		dstB, okD := epBefore(dst)
		if !okS || !okD {
			return // not compared
		}
		egressA := ea.AllowedIn(policy.Egress, src, dst, probe)
		egressB := egressA
		if egressTouched {
			egressB = eb.AllowedIn(policy.Egress, srcB, dstB, probe)
		}
		isAllowed, wasAllowed := egressA, egressB
		if egressA || egressB {
			ingressA := ea.AllowedIn(policy.Ingress, src, dst, probe)
			ingressB := ingressA
			if ingressTouched {
				ingressB = eb.AllowedIn(policy.Ingress, srcB, dstB, probe)
			}
			isAllowed, wasAllowed = egressA && ingressA, egressB && ingressB
		}
		evaluated.Add(1)
		if wasAllowed == isAllowed {
			return
		}
		c := Change{From: ra.Pod(src.Pod).Key, To: ra.Pod(dst.Pod).Key, Protocol: probe.Protocol, Port: probe.Port, Before: wasAllowed, After: isAllowed}
		// The side that flipped (egress when both did, as Flipped says),
		// decided again with its trace.
		d := policy.Ingress
		if egressA != egressB {
			d = policy.Egress
		}
		c.Direction = d.String()
		c.BeforeDecision, c.AfterDecision = eb.DecisionIn(d, srcB, dstB, probe, o.Explain), ea.DecisionIn(d, src, dst, probe, o.Explain)
		mu.Lock()
		changes = append(changes, indexed{c, cell.Index})
		mu.Unlock()
	})
	// In the table's order: by port, source, destination.
	slices.SortFunc(changes, func(a, b indexed) int { return a.index - b.index })
	for _, c := range changes {
		res.Changes = append(res.Changes, c.Change)
	}
	res.Evaluated = int(evaluated.Load())
	beforePods := eb.TablePods(opts)
	res.OnlyAfter, res.OnlyBefore = missing(table.Pods, beforePods), missing(beforePods, table.Pods)
	both := len(table.Pods) - len(res.OnlyAfter)
	res.CellsCompared = both * both * len(opts.Probes)
	res.Unchanged = res.CellsCompared - len(res.Changes)
	return res
}

// Flipped is the side whose verdict differs between two verdicts of one
// connection (egress when both do; before is nil when it could not be
// evaluated before) and its decision in each.
func Flipped(before, after *eval.Verdict) (string, *eval.DirectionVerdict, *eval.DirectionVerdict) {
	side := func(v *eval.Verdict, egress bool) *eval.DirectionVerdict {
		if v == nil {
			return nil
		}
		if egress {
			return v.Egress
		}
		return v.Ingress
	}
	allowed := func(dv *eval.DirectionVerdict) bool { return dv == nil || dv.Allowed }
	egress := before == nil || allowed(before.Egress) != allowed(after.Egress)
	d := policy.Ingress
	if egress {
		d = policy.Egress
	}
	return d.String(), side(before, egress), side(after, egress)
}

// touchedPods says, per direction, which of ra's pods a changed policy
// selects, in ra or (the pod of the same name) in rb.
func touchedPods(rb, ra *eval.Resolved, changed map[string]bool) [2][]bool {
	byName := make(map[string]int, ra.NumPods())
	for i := range ra.NumPods() {
		byName[ra.Pod(i).Key] = i
	}
	var touched [2][]bool
	for _, d := range policy.Directions {
		touched[d] = make([]bool, ra.NumPods())
	}
	mark := func(r *eval.Resolved, pod, at int) {
		pols := r.Policies()
		for _, d := range policy.Directions {
			for _, tier := range []policy.Tier{policy.TierAdmin, policy.TierNetworkPolicy, policy.TierBaseline} {
				for _, pi := range r.Selecting(tier, d, pod) {
					if changed[pols[pi].Ref()] {
						touched[d][at] = true
					}
				}
			}
		}
	}
	for i := range ra.NumPods() {
		mark(ra, i, i)
	}
	for i := range rb.NumPods() {
		if at, ok := byName[rb.Pod(i).Key]; ok {
			mark(rb, i, at)
		}
	}
	return touched
}

// changedPolicies are the policies added, deleted, or changed between
// before and after, by policy.Policy.Ref. A policy is compared by what
// decides: its spec and the netpol.io annotations (not its status or
// bookkeeping metadata, which a live object has and a file does not).
func changedPolicies(before, after *cluster.Snapshot) map[string]bool {
	index := func(s *cluster.Snapshot) map[string]any {
		out := map[string]any{}
		for _, obj := range s.PolicyObjects() {
			key, ok := policyKey(obj)
			if ok {
				out[key] = obj
			}
		}
		return out
	}
	b, a := index(before), index(after)
	changed := map[string]bool{}
	for key, ob := range b {
		if oa, ok := a[key]; !ok || !samePolicy(ob, oa) {
			changed[key] = true
		}
	}
	for key := range a {
		if _, ok := b[key]; !ok {
			changed[key] = true
		}
	}
	return changed
}

// policyKey is a policy object's policy.Policy.Ref.
func policyKey(obj any) (string, bool) {
	key, ok := cluster.PolicyKey(obj)
	return key.String(), ok
}

// samePolicy reports whether two versions of a policy object decide
// alike: equal specs and netpol.io annotations.
func samePolicy(a, b any) bool {
	if reflect.TypeOf(a) != reflect.TypeOf(b) {
		return false
	}
	own := func(obj any) map[string]string { return cluster.OwnAnnotations(obj.(metav1.Object).GetAnnotations()) }
	if !maps.Equal(own(a), own(b)) {
		return false
	}
	spec := func(obj any) any { return reflect.ValueOf(obj).Elem().FieldByName("Spec").Interface() }
	return equality.Semantic.DeepEqual(spec(a), spec(b))
}

// sameWorkloads reports whether the two states have the same pods,
// namespaces and nodes, alike in all that policy reads of them.
func sameWorkloads(before, after *cluster.Snapshot) bool {
	return sameObjects(before.Pods, after.Pods) && sameObjects(before.Namespaces, after.Namespaces) && sameObjects(before.Nodes, after.Nodes)
}

// sameObjects reports whether two lists hold the same objects by
// namespace and name, semantically equal (order aside).
func sameObjects[T interface {
	GetNamespace() string
	GetName() string
}](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	byKey := make(map[[2]string]T, len(a))
	for _, o := range a {
		byKey[[2]string{o.GetNamespace(), o.GetName()}] = o
	}
	for _, o := range b {
		p, ok := byKey[[2]string{o.GetNamespace(), o.GetName()}]
		if !ok || !equality.Semantic.DeepEqual(p, o) {
			return false
		}
	}
	return true
}

// missing are the names of a that b lacks, in a's order.
func missing(a, b []string) []string {
	in := make(map[string]bool, len(b))
	for _, n := range b {
		in[n] = true
	}
	var out []string
	for _, n := range a {
		if !in[n] {
			out = append(out, n)
		}
	}
	return out
}

// unionProbes is a's probes then b's that a lacks.
func unionProbes(a, b []l4.Port) []l4.Port {
	out := slices.Clone(a)
	for _, p := range b {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// MarshalIndent is the result as `netpol diff -o json` prints it.
func (r *Result) MarshalIndent() ([]byte, error) {
	if r.Changes == nil {
		r.Changes = []Change{}
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("diff: %w", err)
	}
	return append(b, '\n'), nil
}
