package proxy_test

import (
	"bytes"
	"cmp"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/nftcheck"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/proxy"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestCompileGolden renders the NAT table of fixture snapshots and compares
// it with the golden files; each golden file must also be accepted by
// `nft -c` (when nft is installed), so the rendered text is real nft.
func TestCompileGolden(t *testing.T) {
	cases := []struct {
		name, node string
		paths      []string
		opts       proxy.Options
		golden     string // default name
	}{
		{name: "services-n1", paths: []string{"testdata/services.yaml"}, node: "n1"},
		{name: "services-n2", paths: []string{"testdata/services.yaml"}, node: "n2"},
		{name: "demo-node-1", paths: []string{"../../examples/demo"}, node: "node-1"},
		// The Service ranges given: what no Service holds is dropped.
		{name: "services-n1-service-cidrs", paths: []string{"testdata/services.yaml"}, node: "n1", opts: proxy.Options{ServiceCIDRs: []netip.Prefix{
			netip.MustParsePrefix("fd00:96::/108"), netip.MustParsePrefix("10.96.0.0/16")}}},
		// The same ranges read from ServiceCIDR objects: the same table.
		{name: "services-n1-servicecidr-objects", paths: []string{"testdata/services.yaml", "testdata/servicecidrs.yaml"}, node: "n1",
			golden: "services-n1-service-cidrs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			snap, report := cluster.LoadPaths(c.paths, nil)
			if len(report.Errors) > 0 {
				t.Fatal(report.Errors)
			}
			m := proxy.Build(snap, c.node, c.opts)
			if len(m.Errors) > 0 {
				t.Fatal(m.Errors)
			}
			table, err := proxy.Compile(m, proxy.CompileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := table.Render(&got); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "golden", cmp.Or(c.golden, c.name)+".nft")
			if *update && c.golden == "" {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("%s differs from the compiled table (run with -update and review the diff):\n%s", golden, got.String())
			}
			nftCheck(t, golden)
		})
	}
}

func nftCheck(t *testing.T, path string) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Logf("nft not installed: %s not checked by nft -c", path)
		return
	}
	if !kerneltest.Can(t, "nft -c checks "+path+" against the kernel") {
		return
	}
	if out, err := nftcheck.Check(path); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
}
