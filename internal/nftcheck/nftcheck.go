// Package nftcheck has the golden tests' `nft -c -f FILE`: the nft binary
// checks a rendered ruleset against the kernel without committing it.
// `nft -c` validates against the tables the current network namespace
// holds, so a table of the same name already there (an agent on the host,
// another test's) would make a correct file fail: as root it runs in a
// network namespace of its own.
package nftcheck

import (
	"fmt"
	"os"
	"os/exec"
)

// Check runs nft -c -f path and returns its output; an error when nft
// rejects the file or cannot run.
func Check(path string) ([]byte, error) {
	bin, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("the nft binary is needed to check %s (Debian package nftables): %w", path, err)
	}
	cmd := exec.Command(bin, "-c", "-f", path)
	if os.Geteuid() == 0 {
		if unshare, err := exec.LookPath("unshare"); err == nil {
			cmd = exec.Command(unshare, "--net", bin, "-c", "-f", path)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("nft -c -f %s: %w", path, err)
	}
	return out, nil
}
