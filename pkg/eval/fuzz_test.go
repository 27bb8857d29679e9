package eval_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// fuzzBases are the base snapshots FuzzEvaluate picks from, by name
// (testdata/base/NAME.yaml), sorted.
func fuzzBases(f *testing.F) (names []string, data [][]byte) {
	files, _ := filepath.Glob(filepath.Join(fuzzTestdata, "base", "*.yaml"))
	slices.Sort(files)
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		names = append(names, strings.TrimSuffix(filepath.Base(file), ".yaml"))
		data = append(data, b)
	}
	if len(files) == 0 {
		f.Fatal("no base snapshots")
	}
	return names, data
}

// fuzzTestdata is the repository's testdata directory.
const fuzzTestdata = "../../testdata"

var fuzzProtocols = [...]corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
var fuzzFamilies = [...]ipfamily.Family{ipfamily.Any, ipfamily.IPv4, ipfamily.IPv6}

// FuzzEvaluate: a base snapshot plus fuzzed policy YAML; Build, New, Table
// and Explain never panic, and Explain's verdict for the chosen pair equals
// the table's cell.
func FuzzEvaluate(f *testing.F) {
	names, bases := fuzzBases(f)
	baseIndex := func(name string) uint8 {
		return uint8(max(slices.Index(names, name), 0))
	}
	// Seeds: every manifest the corpus cases apply, on their own base.
	cases, err := corpus.LoadDir(fuzzTestdata)
	if err != nil {
		f.Fatal(err)
	}
	seeds := 0
	for i, c := range cases {
		docs := c.AppliedYAML()
		if docs == "" {
			continue
		}
		f.Add([]byte(docs), baseIndex(c.Base), uint8(i), uint8(i/3), uint8(i%9), uint16(80+i%2))
		seeds++
	}
	for _, file := range []string{"../policy/testdata/mixed.yaml", "../cluster/testdata/all-kinds.yaml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		for i := range 4 {
			f.Add(data, baseIndex("e2e"), uint8(i), uint8(i+1), uint8(i), uint16(79+i))
		}
		seeds++
	}
	if seeds == 0 {
		f.Fatal("no seeds")
	}
	f.Add([]byte(""), uint8(0), uint8(0), uint8(0), uint8(0), uint16(0))

	f.Fuzz(func(t *testing.T, policyYAML []byte, base, src, dst, protoFamily uint8, port uint16) {
		snap := cluster.New()
		if r := snap.AddDocuments(bases[int(base)%len(bases)], "base.yaml", false); len(r.Errors) > 0 {
			t.Fatalf("base %s: %v", names[int(base)%len(bases)], r.Errors)
		}
		// Like a corpus step: the fuzzed objects replace what is there.
		snap.AddDocuments(policyYAML, "fuzz.yaml", true)
		if len(snap.Pods) > 32 {
			return
		}
		model := policy.Build(snap)
		ev := eval.New(snap, model)
		probe := l4.Port{Protocol: fuzzProtocols[int(protoFamily)%3], Port: int32(port)%65535 + 1}
		family := fuzzFamilies[int(protoFamily/3)%3]
		table := ev.TruthTable(eval.TruthTableOptions{Probes: []l4.Port{probe}, Family: family})
		ev.TruthTable(eval.TruthTableOptions{}) // declared ports
		n := len(table.Pods)
		if len(table.Results) != n*n {
			t.Fatalf("%d results for %d pods", len(table.Results), n)
		}
		if n == 0 {
			return
		}
		si, di := int(src)%n, int(dst)%n
		cell := table.Results[si*n+di]
		from, to := table.Pods[si], table.Pods[di]
		if cell.From != from || cell.To != to {
			t.Fatalf("cell %d,%d is %s -> %s, want %s -> %s", si, di, cell.From, cell.To, from, to)
		}
		v, err := ev.Explain(from, to, probe, family)
		if err != nil {
			// Only a pair that cannot talk in this family may fail to resolve.
			if cell.Allowed {
				t.Fatalf("Explain(%s, %s, %s, %q): %v, but the table allows it", from, to, probe, family, err)
			}
			return
		}
		if v.Allowed != cell.Allowed {
			t.Fatalf("Explain(%s, %s, %s, %q).Allowed = %v, table cell = %v\negress %+v\ningress %+v",
				from, to, probe, family, v.Allowed, cell.Allowed, v.Egress, v.Ingress)
		}
		if v.Egress != nil && v.Ingress != nil && v.Allowed != (v.Egress.Allowed && v.Ingress.Allowed) {
			t.Fatalf("verdict %v but egress %v, ingress %v", v.Allowed, v.Egress.Allowed, v.Ingress.Allowed)
		}
		// Addresses as endpoints must not panic either.
		if v.FromIP != "" && v.ToIP != "" {
			if _, err := ev.Explain(v.FromIP, v.ToIP, probe, family); err != nil {
				t.Fatalf("Explain(%s, %s): %v", v.FromIP, v.ToIP, err)
			}
		}
	})
}
