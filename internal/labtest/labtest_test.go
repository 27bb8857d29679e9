package labtest

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/pkg/lab"
)

// TestRemoveOrphans: the lab of a test process that is gone is removed;
// the lab of one that runs (this one) stays.
func TestRemoveOrphans(t *testing.T) {
	kerneltest.Require(t, "makes network namespaces")
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	orphan := fmt.Sprintf("%s%d-0000aa", ownerPrefix, gone.Process.Pid)
	mine := fmt.Sprintf("%s%d-0000bb", ownerPrefix, os.Getpid())
	if running(gone.Process.Pid) {
		t.Skipf("pid %d was given to another process already", gone.Process.Pid)
	}
	for _, prefix := range []string{orphan, mine} {
		t.Cleanup(func() { lab.DownAll(prefix + "-") })
		for _, name := range []string{prefix + "-underlay", prefix + "-n-0"} {
			if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
				t.Fatalf("ip netns add %s: %v: %s", name, err, out)
			}
		}
	}
	removed, err := removeOrphans()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{orphan + "-n-0", orphan + "-underlay"}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	labs, err := lab.List(ownerPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(labs[orphan]) != 0 || len(labs[mine]) != 2 {
		t.Errorf("labs left: %v; want %s's two namespaces only", labs, mine)
	}
}
