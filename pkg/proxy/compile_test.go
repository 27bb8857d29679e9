package proxy_test

import (
	"bytes"
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
		name, path, node string
		opts             proxy.Options
	}{
		{"services-n1", "testdata/services.yaml", "n1", proxy.Options{}},
		{"services-n2", "testdata/services.yaml", "n2", proxy.Options{}},
		{"demo-node-1", "../../examples/demo", "node-1", proxy.Options{}},
		// The Service ranges given: what no Service holds is dropped.
		{"services-n1-service-cidrs", "testdata/services.yaml", "n1", proxy.Options{ServiceCIDRs: []netip.Prefix{
			netip.MustParsePrefix("fd00:96::/108"), netip.MustParsePrefix("10.96.0.0/16")}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			snap, report := cluster.LoadPaths([]string{c.path}, nil)
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
			golden := filepath.Join("testdata", "golden", c.name+".nft")
			if *update {
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
