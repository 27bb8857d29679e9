// Package corpus reads the policy test corpus (testdata/cases, described in
// docs/testcases.md): cases of cluster state changes, each followed by the
// connectivity it must produce. The evaluator tests and the kernel lab tests
// run the same cases.
package corpus

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
)

// Case is one case file.
type Case struct {
	Name        string   `json:"name"`
	Source      string   `json:"source"`
	Description string   `json:"description,omitempty"`
	Base        string   `json:"base"`
	Pods        []string `json:"pods,omitempty"`
	Family      string   `json:"family,omitempty"`
	Steps       []Step   `json:"steps"`

	Suite string `json:"-"`
	File  string `json:"-"`
}

// Step changes the cluster state, then states what connectivity follows.
type Step struct {
	Name   string      `json:"name,omitempty"`
	Delete []ObjectRef `json:"delete,omitempty"`
	Apply  string      `json:"apply,omitempty"`
	Expect []Expect    `json:"expect,omitempty"`
}

// ObjectRef names an object to delete.
type ObjectRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// Expect is the connectivity on some ports.
type Expect struct {
	Ports   []string `json:"ports"`
	Default string   `json:"default,omitempty"`
	Cells   []Cell   `json:"cells,omitempty"`
}

// Cell sets the expectation for the pod pairs its patterns match.
type Cell struct {
	From    string `json:"from"`
	To      string `json:"to"`
	Allowed bool   `json:"allowed"`
}

// LoadDir reads every case under root/cases/<suite>/*.yaml.
func LoadDir(root string) ([]*Case, error) {
	files, err := filepath.Glob(filepath.Join(root, "cases", "*", "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var cases []*Case
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		c := &Case{}
		if err := yaml.UnmarshalStrict(data, c); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		c.File = f
		c.Suite = filepath.Base(filepath.Dir(f))
		if c.Name == "" {
			c.Name = strings.TrimSuffix(filepath.Base(f), ".yaml")
		}
		cases = append(cases, c)
	}
	return cases, nil
}

// BaseSnapshot loads the case's base and keeps only the pods it lists.
func (c *Case) BaseSnapshot(root string) (*cluster.Snapshot, error) {
	snap, report := cluster.LoadPaths([]string{filepath.Join(root, "base", c.Base+".yaml")}, nil)
	if len(report.Errors) > 0 {
		return nil, fmt.Errorf("base %s: %v", c.Base, report.Errors)
	}
	if len(c.Pods) > 0 {
		keep := map[string]bool{}
		for _, p := range c.Pods {
			keep[p] = true
		}
		for _, p := range append(snap.Pods[:0:0], snap.Pods...) {
			if !keep[p.Namespace+"/"+p.Name] {
				snap.Delete(cluster.ObjectKey{Kind: cluster.KindPod, Namespace: p.Namespace, Name: p.Name})
			}
		}
	}
	return snap, nil
}

// ApplyStep changes snap as the step says. Errors name the case and step.
func (c *Case) ApplyStep(snap *cluster.Snapshot, i int) error {
	st := c.Steps[i]
	for _, ref := range st.Delete {
		if !snap.Delete(cluster.ObjectKey{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name}) {
			return fmt.Errorf("step %d: delete %s %s/%s: not there", i, ref.Kind, ref.Namespace, ref.Name)
		}
	}
	if st.Apply != "" {
		report := snap.AddDocuments([]byte(st.Apply), fmt.Sprintf("%s step %d", c.File, i), true)
		if len(report.Errors) > 0 {
			return fmt.Errorf("step %d: %v", i, report.Errors)
		}
	}
	return nil
}

// Replay builds the case's cluster step by step: its base (read below
// root), then each step applied in turn, after which each is called with
// the step's index, the cluster as it then is (one snapshot, changed in
// place) and the case's address family. It returns the first error of
// the base, the family or a step that does not apply.
func (c *Case) Replay(root string, each func(i int, snap *cluster.Snapshot, family ipfamily.Family)) error {
	snap, err := c.BaseSnapshot(root)
	if err != nil {
		return err
	}
	family, err := c.AddressFamily()
	if err != nil {
		return err
	}
	for i := range c.Steps {
		if err := c.ApplyStep(snap, i); err != nil {
			return err
		}
		each(i, snap, family)
	}
	return nil
}

// Family is the case's address family.
func (c *Case) AddressFamily() (ipfamily.Family, error) {
	if c.Family == "" {
		return ipfamily.IPv4, nil
	}
	return ipfamily.Parse(c.Family)
}

// Key identifies one cell of a truth table.
type Key struct {
	From, To string
	Probe    l4.Port
}

// Expected expands an Expect into cells over pods (namespace/name); self
// pairs are never included.
func (x Expect) Expected(pods []string) (map[Key]bool, error) {
	probes, err := l4.ParsePorts(x.Ports)
	if err != nil {
		return nil, err
	}
	out := map[Key]bool{}
	for _, probe := range probes {
		if x.Default != "" {
			if x.Default != "allowed" && x.Default != "denied" {
				return nil, fmt.Errorf("default %q: allowed or denied", x.Default)
			}
			for _, f := range pods {
				for _, t := range pods {
					if f != t {
						out[Key{f, t, probe}] = x.Default == "allowed"
					}
				}
			}
		}
		for _, c := range x.Cells {
			matched := false
			for _, f := range pods {
				for _, t := range pods {
					if f != t && match(c.From, f) && match(c.To, t) {
						out[Key{f, t, probe}] = c.Allowed
						matched = true
					}
				}
			}
			if !matched && !strings.Contains(c.From+c.To, "*") {
				return nil, fmt.Errorf("cell %s -> %s names no pod pair of the case", c.From, c.To)
			}
		}
	}
	return out, nil
}

func match(pattern, pod string) bool {
	if pattern == "*" || pattern == pod {
		return true
	}
	ns, name, _ := strings.Cut(pattern, "/")
	podNS, _, _ := strings.Cut(pod, "/")
	return name == "*" && ns == podNS
}

// AppliedYAML is every manifest the case's steps apply, as one YAML stream
// ("" when no step applies anything): seeds for the fuzz targets.
func (c *Case) AppliedYAML() string {
	var docs []string
	for _, st := range c.Steps {
		if st.Apply != "" {
			docs = append(docs, st.Apply)
		}
	}
	return strings.Join(docs, "\n---\n")
}
