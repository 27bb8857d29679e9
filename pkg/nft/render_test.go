package nft_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/nftcheck"
	"github.com/netpol/netpol/pkg/nft/internal/nfttest"
)

// TestIdentityStatementsRender: nft itself takes the rendered table, and
// the rules read as nft writes them.
func TestIdentityStatementsRender(t *testing.T) {
	var buf bytes.Buffer
	if err := nfttest.IdentityTable().Render(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"typeof ip saddr : meta mark", "127.0.0.1 : 327681", "327680-393215 . udp . 9000-9001",
		"meta mark set 0x00000000", "meta mark set ip saddr map @ids4", "meta mark . meta l4proto . th dport @allow accept",
		"meta mark @ids meta l4proto . th dport @denied-ports drop",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("rendered table lacks %q:\n%s", want, buf.String())
		}
	}
	path := filepath.Join(t.TempDir(), "identity.nft")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if !kerneltest.Can(t, "nft -c checks the rendered table against the kernel") {
		return
	}
	if out, err := nftcheck.Check(path); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}
