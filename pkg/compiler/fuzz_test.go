package compiler_test

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// FuzzCompile: a base snapshot plus fuzzed YAML; compiling every node
// never panics and yields a table the kernel can take: every set and
// chain a rule or map names exists, interval elements do not overlap; and
// the tables, traced, decide random cells as the evaluator does.
func FuzzCompile(f *testing.F) {
	bases, cases := loadCorpus(f)
	for _, c := range cases {
		if docs := c.AppliedYAML(); docs != "" {
			base := slices.Index(bases, filepath.Join(testdata, "base", c.Base+".yaml"))
			f.Add([]byte(docs), uint8(max(base, 0)))
		}
	}
	f.Fuzz(func(t *testing.T, doc []byte, pick uint8) {
		snap := baseWith(t, bases[int(pick)%len(bases)], doc, "fuzz")
		ev := eval.New(snap, policy.Build(snap))
		resolved := ev.Resolved()
		for _, layout := range []compiler.Layout{compiler.LayoutAddresses, compiler.LayoutIdentities} {
			for _, n := range snap.Nodes {
				table, err := compiler.Compile(resolved, compiler.Options{Node: n.Name, Layout: layout})
				if err != nil {
					t.Fatalf("node %s: %v", n.Name, err)
				}
				if err := checkTable(table); err != nil {
					var b bytes.Buffer
					table.Render(&b)
					t.Fatalf("node %s: %v\n%s", n.Name, err, b.String())
				}
			}
			tracedAgrees(t, snap, ev, doc, layout)
		}
	})
}

// loadCorpus returns the base cluster files (sorted) and the corpus cases.
func loadCorpus(tb testing.TB) ([]string, []*corpus.Case) {
	tb.Helper()
	bases, _ := filepath.Glob(filepath.Join(testdata, "base", "*.yaml"))
	slices.Sort(bases)
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		tb.Fatal(err)
	}
	return bases, cases
}

// tracedAgrees checks up to 64 cells, picked from the fuzz input, of the
// table traced through every node's tables against the evaluator. Cells of
// pods on a node the snapshot lacks are left out (no tables enforce them),
// and so are cells whose addresses two endpoints claim (which one a packet
// reaches is up to routing).
func tracedAgrees(t *testing.T, snap *cluster.Snapshot, ev *eval.Evaluator, seed []byte, layout compiler.Layout) {
	dp, err := dataplane.NewWith(snap, ev, dataplane.Options{Layout: layout})
	if err != nil {
		t.Fatalf("data plane: %v", err)
	}
	probes := []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}, {Protocol: "TCP", Port: 8080}, {Protocol: "SCTP", Port: 80}}
	want := ev.TruthTable(eval.TruthTableOptions{Probes: probes})
	n := len(want.Results)
	if n == 0 {
		return
	}
	nodes := map[string]bool{}
	for _, nd := range snap.Nodes {
		nodes[nd.Name] = true
	}
	onNode := map[string]bool{}
	claims := map[netip.Addr]int{}
	for _, p := range snap.Pods {
		onNode[p.Namespace+"/"+p.Name] = nodes[p.Spec.NodeName]
		if !p.Spec.HostNetwork {
			for _, a := range cluster.PodAddresses(p) {
				claims[a]++
			}
		}
	}
	for _, nd := range snap.Nodes {
		for _, na := range nd.Status.Addresses {
			if a, err := netip.ParseAddr(na.Address); err == nil {
				claims[a.Unmap()]++
			}
		}
	}
	h := fnv.New64a()
	h.Write(seed)
	r := rand.New(rand.NewPCG(h.Sum64(), uint64(n)))
	for range min(64, n) {
		w := want.Results[r.IntN(n)]
		if !onNode[w.From] || !onNode[w.To] {
			continue
		}
		dst, err := ev.Endpoint(w.To, ipfamily.Any, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		src, err := ev.Endpoint(w.From, ipfamily.Any, dst.Addr)
		if err != nil {
			continue // no address of the destination's family: the table says denied
		}
		if claims[src.Addr] > 1 || claims[dst.Addr] > 1 {
			continue
		}
		got := dp.Allowed(src, dst, l4.Port{Protocol: w.Protocol, Port: w.Port})
		if err := dp.Err(); err != nil {
			t.Fatalf("tracing %s -> %s: %v", w.From, w.To, err)
		}
		if got != w.Allowed {
			t.Fatalf("%s -> %s %s/%d: traced %v, evaluator %v", w.From, w.To, w.Protocol, w.Port, got, w.Allowed)
		}
	}
}

var setRef = regexp.MustCompile(`@([^\s]+)`)

// checkTable finds what the kernel would reject in a compiled table.
func checkTable(t *nft.Table) error {
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			for _, m := range setRef.FindAllStringSubmatch(r.Text, -1) {
				if t.Sets[m[1]] == nil {
					return fmt.Errorf("chain %s: rule %q names a missing set", c.Name, r.Text)
				}
			}
			if f := strings.Fields(r.Text); len(f) >= 2 && (f[len(f)-2] == "goto" || f[len(f)-2] == "jump") && t.Chains[f[len(f)-1]] == nil {
				return fmt.Errorf("chain %s: rule %q goes to a missing chain", c.Name, r.Text)
			}
		}
	}
	for _, s := range t.Sets {
		seen := map[string]bool{}
		for i, e := range s.Elements {
			if v := e.Verdict; v != nil && v.Chain != "" && t.Chains[v.Chain] == nil {
				return fmt.Errorf("map %s: element %s goes to a missing chain", s.Name, s.ElementText(e))
			}
			if seen[string(e.Key)] {
				return fmt.Errorf("set %s: key %s twice", s.Name, s.ElementText(e))
			}
			seen[string(e.Key)] = true
			if !s.Interval {
				continue
			}
			for _, o := range s.Elements[i+1:] {
				if overlap(s, e, o) {
					return fmt.Errorf("set %s: %s overlaps %s", s.Name, s.ElementText(e), s.ElementText(o))
				}
			}
		}
	}
	return nil
}

// overlap reports whether two interval elements share a key: for a
// concatenation, every field's ranges must overlap.
func overlap(s *nft.Set, a, b nft.Element) bool {
	end := func(e nft.Element) []byte {
		if e.KeyEnd != nil {
			return e.KeyEnd
		}
		return e.Key
	}
	off := 0
	for _, f := range s.Fields {
		n := f.Len()
		lo1, hi1 := a.Key[off:off+n], end(a)[off:off+n]
		lo2, hi2 := b.Key[off:off+n], end(b)[off:off+n]
		if bytes.Compare(hi1, lo2) < 0 || bytes.Compare(hi2, lo1) < 0 {
			return false
		}
		off += n
		if len(s.Fields) > 1 {
			off = (off + 3) &^ 3
		}
	}
	return true
}

// TestTracedAgreesOnMutatedSeeds is FuzzCompile's check on a fixed stream
// of mutated corpus documents (bytes changed, inserted, removed), so that
// plain `go test` compares the traced tables with the evaluator on random
// snapshots too (the Go fuzzer runs only under `make fuzz`).
func TestTracedAgreesOnMutatedSeeds(t *testing.T) {
	bases, cases := loadCorpus(t)
	var seeds [][]byte
	for _, c := range cases {
		if d := c.AppliedYAML(); d != "" {
			seeds = append(seeds, []byte(d))
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	const inputs = 300
	for i := range inputs {
		doc := slices.Clone(seeds[r.IntN(len(seeds))])
		for k := r.IntN(4) + 1; k > 0; k-- {
			switch r.IntN(3) {
			case 0:
				if len(doc) > 0 {
					doc[r.IntN(len(doc))] = byte(r.IntN(256))
				}
			case 1:
				at := r.IntN(len(doc) + 1)
				doc = slices.Insert(doc, at, "0123456789:-/ \n"[r.IntN(15)])
			case 2:
				if len(doc) > 2 {
					at := r.IntN(len(doc) - 1)
					doc = slices.Delete(doc, at, at+1)
				}
			}
		}
		snap := baseWith(t, bases[r.IntN(len(bases))], doc, "mutated")
		ev := eval.New(snap, policy.Build(snap))
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			tracedAgrees(t, snap, ev, doc, compiler.LayoutAddresses)
			tracedAgrees(t, snap, ev, doc, compiler.LayoutIdentities)
		})
	}
}
