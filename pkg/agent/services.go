package agent

import (
	"path/filepath"
	"strings"
)

// netnsPath is the file of a network namespace given by name (under
// /run/netns, as `ip netns` makes them) or by path.
func netnsPath(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return filepath.Join("/run/netns", name)
}
